//! One chaos app instance: `chaos-app <plan.json>` (see `chaos_tests::app`).

// One worker: three apps, Redis and the controller share two cores.
#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: chaos-app <plan.json>");
        std::process::exit(2);
    };
    let plan = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
    {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("chaos-app: cannot read plan {path}: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = chaos_tests::app::run(plan).await {
        eprintln!("chaos-app: {e}");
        std::process::exit(1);
    }
}
