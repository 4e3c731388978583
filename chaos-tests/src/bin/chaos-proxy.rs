//! The fault proxy as a program, for the docker driver's `proxy` service:
//! `chaos-proxy --listen ADDR --upstream HOST:PORT --control ADDR`
//! (see `chaos_tests::proxy` for the control protocol).

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;

use tierlimit_test::FaultProxy;

const USAGE: &str = "usage: chaos-proxy --listen ADDR --upstream HOST:PORT --control ADDR";

struct Args {
    listen: SocketAddr,
    upstream: String,
    control: SocketAddr,
}

fn parse() -> Result<Args, String> {
    let (mut listen, mut upstream, mut control) = (None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let value = it.next().ok_or_else(|| format!("{arg} needs a value"))?;
        let addr = |v: &str| {
            v.parse::<SocketAddr>()
                .map_err(|e| format!("{arg} {v:?}: {e} (give ip:port)"))
        };
        match arg.as_str() {
            "--listen" => listen = Some(addr(&value)?),
            "--control" => control = Some(addr(&value)?),
            "--upstream" => upstream = Some(value),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen is required")?,
        upstream: upstream.ok_or("--upstream is required")?,
        control: control.ok_or("--control is required")?,
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos-proxy: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let proxy = match FaultProxy::listen(args.listen, &args.upstream) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("chaos-proxy: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let control = match TcpListener::bind(args.control) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("chaos-proxy: cannot listen on {}: {e}", args.control);
            return ExitCode::FAILURE;
        }
    };
    // The first line says where both ports are (the chaos suite's test reads
    // it when it asked for port 0).
    let control_addr = control.local_addr().unwrap_or(args.control);
    eprintln!(
        "chaos-proxy: {} -> {}, control on {control_addr}",
        proxy.addr(),
        proxy.upstream(),
    );
    let e = chaos_tests::proxy::serve(&proxy, &control);
    eprintln!("chaos-proxy: control port failed: {e}");
    ExitCode::FAILURE
}
