//! The report of a suite run: JSON, a Markdown table, and an SVG chart.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::analyze::ScenarioResult;

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Driver.
    pub driver: String,
    /// Quick mode?
    pub quick: bool,
    /// The deadline the bounds use, ms.
    pub deadline_ms: u64,
    /// When, s since the Unix epoch.
    pub unix_time: u64,
    /// Scenarios.
    pub scenarios: Vec<ScenarioResult>,
}

impl Report {
    /// PASS when every scenario passed.
    pub fn passed(&self) -> bool {
        self.scenarios.iter().all(ScenarioResult::passed)
    }

    /// One line per broken bound: `FAIL <scenario>: <bound>: <measured>`.
    pub fn failures(&self) -> Vec<String> {
        self.scenarios
            .iter()
            .flat_map(|s| {
                s.checks
                    .iter()
                    .filter(|c| c.verdict == "FAIL")
                    .map(move |c| format!("FAIL {}: {}: {}", s.scenario, c.bound, c.measured))
            })
            .collect()
    }

    /// Writes `<stem>.json`, `<stem>.md` and `<stem>.svg` into `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(format!("{stem}.json")), json)?;
        std::fs::write(dir.join(format!("{stem}.svg")), self.svg())?;
        std::fs::write(
            dir.join(format!("{stem}.md")),
            self.markdown(&format!("{stem}.svg")),
        )?;
        Ok(())
    }

    /// The Markdown report.
    pub fn markdown(&self, chart: &str) -> String {
        let mut md = String::new();
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let _ = writeln!(md, "# tierlimit chaos report: {verdict}\n");
        let _ = writeln!(
            md,
            "Driver `{}`{}, deadline {} ms, three app instances sharing one Redis, each checking three rule sets (one per policy). Decisions per second by tier, fault windows shaded: [chart]({chart}).\n",
            self.driver,
            if self.quick { " (quick)" } else { "" },
            self.deadline_ms
        );
        let _ = writeln!(md, "![decisions per second by tier]({chart})\n");
        let _ = writeln!(
            md,
            "| scenario | policy | admitted by tier | denied by tier | admitted / global limit in outage | max ms | p99 ms | trip ms | recover ms | reconciled | dropped | verdict |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        let fmt_map = |m: &std::collections::BTreeMap<String, u64>| {
            if m.is_empty() {
                "-".to_string()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        for s in &self.scenarios {
            let verdict = if s.passed() { "PASS" } else { "**FAIL**" };
            for (i, p) in s.policies.iter().enumerate() {
                let first = i == 0;
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} |",
                    if first { s.scenario.as_str() } else { "" },
                    p.policy,
                    fmt_map(&p.admitted),
                    fmt_map(&p.denied),
                    p.outage_ratio
                        .map_or("-".to_string(), |r| format!("{r:.2}")),
                    p.max_latency_ms,
                    p.p99_latency_ms,
                    if first { opt(s.trip_ms) } else { String::new() },
                    if first {
                        opt(s.recover_ms)
                    } else {
                        String::new()
                    },
                    if first {
                        s.reconciled_units.to_string()
                    } else {
                        String::new()
                    },
                    if first {
                        s.dropped_units.to_string()
                    } else {
                        String::new()
                    },
                    if first { verdict } else { "" },
                );
            }
        }
        let _ = writeln!(md, "\n## Bounds\n");
        for s in &self.scenarios {
            let _ = writeln!(md, "**{}** ({}):\n", s.scenario, s.about);
            for c in &s.checks {
                let _ = writeln!(md, "- {} {}: {}", c.verdict, c.bound, c.measured);
            }
            if !s.notes.is_empty() {
                let _ = writeln!(md, "\nWhat the apps saw:\n");
                for n in &s.notes {
                    let _ = writeln!(md, "- {n}");
                }
            }
            let _ = writeln!(md);
        }
        md
    }

    /// One panel per scenario: decisions per second by tier over time, the
    /// fault window shaded.
    pub fn svg(&self) -> String {
        // Fail-open, fail-closed and local run at similar rates in an outage:
        // dashes keep the three lines apart where they overlap.
        const TIERS: [(&str, &str, &str); 5] = [
            ("redis", "#1f77b4", ""),
            ("local", "#2ca02c", ""),
            ("deny_cache", "#9467bd", ""),
            ("fail_open", "#ff7f0e", "6 3"),
            ("fail_closed", "#d62728", "2 3"),
        ];
        let (pw, ph, left, top) = (520.0, 150.0, 60.0, 30.0);
        let cols = 2usize;
        let rows = self.scenarios.len().div_ceil(cols).max(1);
        let (w, h) = (
            cols as f64 * (pw + left + 20.0),
            rows as f64 * (ph + top + 40.0) + 40.0,
        );
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        for (i, (tier, color, _)) in TIERS.iter().enumerate() {
            let x = 20.0 + i as f64 * 110.0;
            let _ = writeln!(
                svg,
                r#"<rect x="{x}" y="10" width="12" height="12" fill="{color}"/><text x="{}" y="20">{tier}</text>"#,
                x + 16.0
            );
        }
        let _ = writeln!(
            svg,
            r##"<rect x="600" y="10" width="12" height="12" fill="#f4cccc"/><text x="616" y="20">fault window</text>"##
        );
        for (n, s) in self.scenarios.iter().enumerate() {
            let ox = (n % cols) as f64 * (pw + left + 20.0) + left;
            let oy = (n / cols) as f64 * (ph + top + 40.0) + top + 30.0;
            let t_max = s.series.iter().map(|(t, _, _)| *t).fold(1.0, f64::max) + 0.25;
            let y_max = s
                .series
                .iter()
                .map(|(_, _, v)| *v)
                .max()
                .unwrap_or(1)
                .max(1) as f64;
            let x = |t: f64| ox + t / t_max * pw;
            let y = |v: f64| oy + ph - v / y_max * ph;
            let verdict = if s.passed() { "PASS" } else { "FAIL" };
            let _ = writeln!(
                svg,
                r#"<text x="{ox}" y="{}" font-weight="bold">{} ({verdict})</text>"#,
                oy - 8.0,
                s.scenario
            );
            let (f0, f1) = s.fault_window;
            let _ = writeln!(
                svg,
                r##"<rect x="{}" y="{oy}" width="{}" height="{ph}" fill="#f4cccc"/>"##,
                x(f0),
                (x(f1) - x(f0)).max(1.0)
            );
            let _ = writeln!(
                svg,
                r##"<rect x="{ox}" y="{oy}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
            );
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="end">{:.0}/s</text><text x="{}" y="{}" text-anchor="end">0</text>"#,
                ox - 4.0,
                oy + 10.0,
                y_max,
                ox - 4.0,
                oy + ph
            );
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="end">{:.0} s</text>"#,
                ox + pw,
                oy + ph + 14.0,
                t_max
            );
            for (tier, color, dash) in TIERS {
                let mut pts: Vec<(f64, f64)> = s
                    .series
                    .iter()
                    .filter(|(_, k, _)| k == tier)
                    .map(|(t, _, v)| (*t, *v as f64))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                // Zero where a tier had no decisions in a bucket.
                let mut line = Vec::new();
                let mut prev: Option<f64> = None;
                for (t, v) in pts {
                    if let Some(p) = prev.filter(|p| t - p > 0.26) {
                        line.push((p + 0.25, 0.0));
                        line.push((t - 0.25, 0.0));
                    }
                    line.push((t, v));
                    prev = Some(t);
                }
                let d: Vec<String> = line
                    .iter()
                    .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
                    .collect();
                let _ = writeln!(
                    svg,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" stroke-dasharray="{dash}" points="{}"/>"#,
                    d.join(" ")
                );
            }
        }
        let _ = writeln!(svg, "</svg>");
        svg
    }
}
