//! Keeps a `noeviction` Redis full, so every write answers `-OOM`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Fills a Redis server with `filler:*` keys until even a tiny write answers
/// `-OOM`, then keeps topping up what expiring keys free, until stopped. A
/// one-shot fill is not enough: the limiter's own keys expire, the room they
/// leave lets some writes through, and the outage turns into flapping.
#[derive(Debug)]
pub struct MemoryFiller {
    url: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

fn connect(url: &str) -> Result<redis::Connection, String> {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .map_err(|e| format!("{url}: {e}"))
}

fn fill(conn: &mut redis::Connection, next: &mut u64, sizes: &[usize]) -> Result<(), String> {
    for &size in sizes {
        let blob = "x".repeat(size);
        loop {
            *next += 1;
            if *next > 1_000_000 {
                return Err("the server never ran out of memory (is maxmemory set?)".into());
            }
            match redis::cmd("SET")
                .arg(format!("filler:{next}"))
                .arg(&blob)
                .query::<()>(conn)
            {
                Ok(()) => {}
                Err(e) if e.code() == Some("OOM") => break,
                Err(e) => return Err(format!("filling memory: {e}")),
            }
        }
    }
    Ok(())
}

impl MemoryFiller {
    /// Fills the server at `url` and returns once it is full; keeps it full in
    /// a background thread.
    pub fn start(url: &str) -> Result<MemoryFiller, String> {
        let mut conn = connect(url)?;
        let mut next = 0;
        fill(&mut conn, &mut next, &[64 * 1024, 4 * 1024, 256, 16])?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                fill(&mut conn, &mut next, &[256, 16])?;
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        });
        Ok(MemoryFiller {
            url: url.to_string(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stops topping up and deletes the filler keys (the others stay).
    pub fn stop(mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread
                .join()
                .map_err(|_| "the memory filler panicked".to_string())??;
        }
        let mut conn = connect(&self.url)?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("filler:*")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        for chunk in keys.chunks(500) {
            redis::cmd("DEL")
                .arg(chunk)
                .query::<()>(&mut conn)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Drop for MemoryFiller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
