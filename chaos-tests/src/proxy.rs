//! The fault proxy as a service of its own, for the docker driver.
//!
//! `chaos-proxy` runs a [`FaultProxy`] in a container between the apps and
//! Redis and takes faults on a control port; [`send`] is the client the docker
//! driver uses. One line each way per request, on a connection that may carry
//! several:
//!
//! ```text
//! -> none | blackhole | reset | refuse | drop-replies | latency <ms>
//! <- ok <the fault, as sent>      once the fault is in force
//! <- err <why>
//! ```

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use tierlimit_test::{Fault, FaultProxy};

/// How long [`send`] waits to connect and for the reply (the proxy itself
/// gives up applying a fault after 5 s).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the control server waits for the next line before it drops a
/// silent client, so that one stuck client cannot lock the port.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A fault as a control line (without the newline).
pub fn encode(fault: Fault) -> String {
    match fault {
        Fault::None => "none".into(),
        Fault::Blackhole => "blackhole".into(),
        Fault::Reset => "reset".into(),
        Fault::Refuse => "refuse".into(),
        Fault::DropReplies => "drop-replies".into(),
        Fault::Latency(d) => format!("latency {}", d.as_millis()),
    }
}

/// Parses a control line.
pub fn decode(line: &str) -> Result<Fault, String> {
    let mut words = line.split_whitespace();
    let fault = match words.next() {
        Some("none") => Fault::None,
        Some("blackhole") => Fault::Blackhole,
        Some("reset") => Fault::Reset,
        Some("refuse") => Fault::Refuse,
        Some("drop-replies") => Fault::DropReplies,
        Some("latency") => {
            let ms = words.next().unwrap_or_default();
            Fault::Latency(Duration::from_millis(ms.parse().map_err(|_| {
                format!("latency needs whole milliseconds, not {ms:?}")
            })?))
        }
        _ => {
            return Err(format!(
                "unknown fault {line:?} (none, blackhole, reset, refuse, drop-replies, latency <ms>)"
            ));
        }
    };
    match words.next() {
        None => Ok(fault),
        Some(extra) => Err(format!("unexpected {extra:?} after the fault in {line:?}")),
    }
}

/// Serves the control port for `proxy`, one client at a time, until accepting
/// fails.
pub fn serve(proxy: &FaultProxy, control: &TcpListener) -> io::Error {
    loop {
        let client = match control.accept() {
            Ok((client, _)) => client,
            Err(e) => return e,
        };
        if let Err(e) = serve_client(proxy, client) {
            eprintln!("chaos-proxy: control client: {e}");
        }
    }
}

fn serve_client(proxy: &FaultProxy, client: TcpStream) -> io::Result<()> {
    client.set_read_timeout(Some(IDLE_TIMEOUT))?;
    let mut out = client.try_clone()?;
    for line in BufReader::new(client).lines() {
        let line = line?;
        let reply = match decode(&line).and_then(|f| proxy.try_set(f).map(|()| f)) {
            Ok(fault) => {
                eprintln!("chaos-proxy: fault {}", encode(fault));
                format!("ok {}", encode(fault))
            }
            Err(e) => format!("err {e}"),
        };
        writeln!(out, "{reply}")?;
    }
    Ok(())
}

/// Sets `fault` on the proxy whose control port is `control`, and returns once
/// it is in force.
pub fn send(control: SocketAddr, fault: Fault) -> Result<(), String> {
    let line = encode(fault);
    let talk = || -> io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&control, REPLY_TIMEOUT)?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        writeln!(stream, "{line}")?;
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply)?;
        Ok(reply.trim_end().to_string())
    };
    let reply = talk().map_err(|e| format!("fault proxy control {control}: {e}"))?;
    if reply == format!("ok {line}") {
        Ok(())
    } else {
        Err(format!(
            "fault proxy control {control} answered {reply:?} to {line:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_survives_the_wire() {
        for fault in [
            Fault::None,
            Fault::Blackhole,
            Fault::Reset,
            Fault::Refuse,
            Fault::DropReplies,
            Fault::Latency(Duration::from_millis(12)),
        ] {
            assert_eq!(decode(&encode(fault)), Ok(fault), "{fault:?}");
        }
    }

    #[test]
    fn bad_lines_are_refused_with_the_reason() {
        for (line, why) in [
            ("", "unknown fault"),
            ("pause", "unknown fault"),
            ("latency", "whole milliseconds, not \"\""),
            ("latency 1.5", "whole milliseconds"),
            ("latency -3", "whole milliseconds"),
            ("reset now", "unexpected \"now\""),
        ] {
            let err = decode(line).expect_err(line);
            assert!(err.contains(why), "{line:?}: {err}");
        }
    }
}
