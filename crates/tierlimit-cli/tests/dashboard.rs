//! The Grafana dashboard shipped with the CLI: valid dashboard JSON whose
//! queries name only metrics the facade documents (which `tests/metrics.rs`
//! proves the demo serves), covering what an operator watches.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;
use support::documented_metrics;

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, row panels' children included.
fn panels(dash: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    let mut stack: Vec<&Value> = dash["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = stack.pop() {
        if let Some(children) = p["panels"].as_array() {
            stack.extend(children);
        }
        all.push(p);
    }
    all
}

/// The `tierlimit_*` names in a PromQL expression (or a variable's query).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tierlimit_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// A served series name back to its documented metric: a histogram's
/// `_bucket`, `_sum` and `_count` series belong to the histogram.
fn documented_as(name: &str, documented: &BTreeSet<String>) -> Option<String> {
    if documented.contains(name) {
        return Some(name.to_owned());
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .find(|base| documented.contains(*base))
        .map(str::to_owned)
}

#[test]
fn the_dashboard_is_grafana_dashboard_json() {
    let dash = dashboard();
    assert!(dash["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dash["uid"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(
        dash["schemaVersion"].as_u64().is_some_and(|v| v >= 30),
        "schemaVersion missing or older than Grafana 8"
    );
    assert!(dash["time"]["from"].is_string() && dash["time"]["to"].is_string());
    let vars = dash["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let names: Vec<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
    assert!(
        names.contains(&"datasource") && names.contains(&"limiter"),
        "{names:?}"
    );

    let mut ids = BTreeSet::new();
    let panels = panels(&dash);
    assert!(panels.len() >= 10, "only {} panels", panels.len());
    for p in panels {
        let id = p["id"].as_u64().expect("every panel has a numeric id");
        assert!(ids.insert(id), "panel id {id} used twice");
        let kind = p["type"].as_str().expect("panel type");
        let title = p["title"].as_str().expect("panel title");
        let grid = &p["gridPos"];
        for field in ["h", "w", "x", "y"] {
            assert!(grid[field].is_u64(), "{title}: gridPos.{field}");
        }
        let right = grid["x"].as_u64().unwrap_or(0) + grid["w"].as_u64().unwrap_or(0);
        assert!(right <= 24, "{title} is wider than the 24-column grid");
        if kind == "row" {
            continue;
        }
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}: no targets");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.is_empty()),
                "{title}: empty expr"
            );
            assert!(
                refs.insert(t["refId"].as_str().expect("refId")),
                "{title}: refId twice"
            );
        }
    }
}

#[test]
fn every_metric_in_the_dashboard_is_documented_and_the_essentials_are_there() {
    let dash = dashboard();
    let documented = documented_metrics();
    let mut used = BTreeSet::new();
    let mut exprs: Vec<String> = panels(&dash)
        .into_iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    for v in dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
    {
        if let Some(q) = v["query"]["query"].as_str().or(v["query"].as_str()) {
            exprs.push(q.to_owned());
        }
    }
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty() || !expr.contains("tierlimit"), "{expr}");
        for name in names {
            let metric = documented_as(&name, &documented)
                .unwrap_or_else(|| panic!("`{name}` in `{expr}` is not a documented metric"));
            used.insert(metric);
        }
    }
    for essential in [
        "tierlimit_decisions_total",
        "tierlimit_breaker_state",
        "tierlimit_redis_call_seconds",
        "tierlimit_ledger_units",
        "tierlimit_ledger_entries",
        "tierlimit_ledger_oldest_seconds",
        "tierlimit_reconciled_units_total",
    ] {
        assert!(
            used.contains(essential),
            "the dashboard does not show {essential}"
        );
    }
    // Decisions by tier and by rule set.
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("tierlimit_decisions_total") && e.contains("by (tier)"))
    );
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("tierlimit_decisions_total") && e.contains("set"))
    );
    // Latency from the histogram's buckets.
    assert!(
        exprs.iter().any(|e| e.contains("histogram_quantile")
            && e.contains("tierlimit_redis_call_seconds_bucket"))
    );
    let unused: Vec<&String> = documented.iter().filter(|m| !used.contains(*m)).collect();
    println!("documented metrics the dashboard leaves out: {unused:?}");
}

#[test]
fn a_name_that_is_not_documented_is_caught() {
    let documented = documented_metrics();
    assert_eq!(
        documented_as("tierlimit_redis_call_seconds_bucket", &documented).as_deref(),
        Some("tierlimit_redis_call_seconds")
    );
    assert_eq!(documented_as("tierlimit_decision_total", &documented), None);
    assert_eq!(
        metric_names("sum(rate(tierlimit_a_total{x=\"y\"}[1m])) / tierlimit_b"),
        ["tierlimit_a_total", "tierlimit_b"]
    );
}
