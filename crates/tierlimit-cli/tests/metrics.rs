//! `tierlimit demo --metrics`: a scrape during the run returns every metric
//! the facade documents, each with its help text, and nothing undocumented.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{Running, documented_metrics, tierlimit};

fn get(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
}

/// The base name of a sample line: `name{labels} value` or `name value`,
/// with a histogram's `_bucket`, `_sum` and `_count` series folded into it.
fn sample_name(line: &str, histograms: &BTreeSet<String>) -> String {
    let name = line.split(['{', ' ']).next().unwrap_or_default();
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && histograms.contains(base)
        {
            return base.to_owned();
        }
    }
    name.to_owned()
}

#[test]
fn a_scrape_during_the_demo_serves_every_documented_metric_with_help() {
    let mut demo = tierlimit();
    demo.args(["demo", "--json", "--metrics", "127.0.0.1:0"])
        .args(["--duration", "6s", "--outage-at", "1s", "--heal-at", "3s"]);
    let mut run = Running::start(demo);
    let note = run.stderr_until(Duration::from_secs(20), |l| {
        l.starts_with("Prometheus metrics: ")
    });
    let url = note
        .last()
        .expect("a line")
        .trim_start_matches("Prometheus metrics: ");
    let addr = url
        .strip_prefix("http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("not a /metrics URL: {url}"))
        .to_owned();
    // After the outage and the recovery, while the demo still runs.
    run.stdout_until(Duration::from_secs(30), |l| l.contains("\"t\":4"));
    let response = get(&addr, "/metrics");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");

    let mut help: BTreeMap<String, String> = BTreeMap::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_owned(), text.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            types.insert(name.to_owned(), kind.to_owned());
        }
    }
    let histograms: BTreeSet<String> = types
        .iter()
        .filter(|(_, k)| *k == "histogram")
        .map(|(n, _)| n.clone())
        .collect();
    let sampled: BTreeSet<String> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| sample_name(l, &histograms))
        .collect();

    let documented = documented_metrics();
    for name in &documented {
        let text = help.get(name).map(String::as_str).unwrap_or_default();
        assert!(
            !text.trim().is_empty(),
            "{name} is documented but served without # HELP text:\n{body}"
        );
        assert!(
            sampled.contains(name),
            "{name} is documented but has no sample:\n{body}"
        );
    }
    let served: BTreeSet<&String> = sampled
        .iter()
        .filter(|n| n.starts_with("tierlimit_"))
        .collect();
    let undocumented: Vec<&&String> = served
        .iter()
        .filter(|n| !documented.contains(**n))
        .collect();
    assert!(
        undocumented.is_empty(),
        "served but not in the facade's table: {undocumented:?}"
    );
    // The Redis latency is a real histogram (buckets), so dashboards can
    // aggregate quantiles over instances.
    assert_eq!(
        types
            .get("tierlimit_redis_call_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    // The outage left its trace: transitions counted per limiter.
    assert!(
        body.lines()
            .any(|l| l.starts_with("tierlimit_breaker_transitions_total{")
                && l.contains("to=\"open\"")),
        "no transition to open was served:\n{body}"
    );

    // Only /metrics is served.
    assert!(get(&addr, "/").starts_with("HTTP/1.1 404"));
    assert_eq!(
        run.wait(Duration::from_secs(30)),
        Some(0),
        "the demo did not finish cleanly"
    );
}
