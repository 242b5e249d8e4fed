//! The picture of a history: a self-contained SVG timeline.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::check::{Verdict, holds};
use crate::history::{FaultKind, History, Op, OpKind, Outcome, ms};

/// Most operations drawn: a long run without violations is shown from its
/// start, this many operations, which keeps the file small enough for a
/// browser. A run with a violation is shown around the first one.
pub const MAX_DRAWN_OPS: usize = 1500;

/// Operations drawn either side of the first violation: few enough that
/// its bars are wide enough to read.
const AROUND_VIOLATION: usize = 100;

const WIDTH: f64 = 1400.0;
const LABEL: f64 = 150.0;
const LANE: f64 = 20.0;
const TOP: f64 = 84.0;
/// Fault labels take turns on this many rows, so neighbours stay legible.
const LABEL_ROWS: usize = 3;

/// Writes [`render_svg`]'s picture to `path`.
pub fn write_svg(history: &History, verdict: &Verdict, path: &Path) -> io::Result<()> {
    std::fs::write(path, render_svg(history, verdict))
}

/// Draws `history` as an SVG page needing nothing else: one lane per owner
/// per session; holds (by the checker's lease model) as bars coloured by
/// token; writes as ticks (green accepted, red fenced, grey unknown);
/// refused and unanswered lease calls as small marks; faults as shaded
/// bands (a paused holder's over its own lanes only); the first violation
/// of `verdict` outlined in red. Hovering any mark shows the operation.
pub fn render_svg(history: &History, verdict: &Verdict) -> String {
    let mut ops: Vec<&Op> = history.ops.iter().collect();
    ops.sort_by_key(|op| (op.invoked, op.id));
    let centre = verdict
        .first
        .as_ref()
        .and_then(|v| ops.iter().position(|op| v.ops.contains(&op.id)));
    let (lo, hi) = match centre {
        Some(c) => (
            c.saturating_sub(AROUND_VIOLATION),
            (c + AROUND_VIOLATION).min(ops.len()),
        ),
        None => (0, MAX_DRAWN_OPS.min(ops.len())),
    };
    let window = &ops[lo..hi];
    let t0 = window.first().map_or(Duration::ZERO, |op| op.invoked);
    let t1 = window
        .iter()
        .map(|op| op.completed)
        .max()
        .unwrap_or(t0)
        .max(t0 + Duration::from_millis(1));
    let drawn: HashSet<u64> = window.iter().map(|op| op.id).collect();

    let mut lanes: BTreeMap<(Arc<str>, Arc<str>), usize> = BTreeMap::new();
    for op in window {
        lanes.insert((Arc::clone(&op.session), Arc::clone(&op.owner)), 0);
    }
    for (i, lane) in lanes.values_mut().enumerate() {
        *lane = i;
    }
    let height = TOP + LANE * lanes.len() as f64 + 40.0;
    let span = (t1 - t0).as_secs_f64();
    let x = |t: Duration| -> f64 {
        let t = t.clamp(t0, t1);
        LABEL + (t - t0).as_secs_f64() / span * (WIDTH - LABEL - 10.0)
    };
    let y = |session: &Arc<str>, owner: &Arc<str>| -> Option<f64> {
        lanes
            .get(&(Arc::clone(session), Arc::clone(owner)))
            .map(|i| TOP + LANE * *i as f64)
    };

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="8" y="16" font-size="13">{}</text><text x="8" y="32">{}</text>"#,
        escape(&summary(verdict)),
        escape(&format!(
            "operations {}..{} of {} shown, {:.1}ms..{:.1}ms",
            lo,
            hi,
            ops.len(),
            ms(t0),
            ms(t1)
        ))
    );
    // Time axis.
    for i in 0..=10 {
        let t = t0 + (t1 - t0) * i / 10;
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="#eee"/><text x="{0:.1}" y="{3}" text-anchor="middle" fill="#888">{4:.0}ms</text>"##,
            x(t),
            TOP - 6.0,
            height - 30.0,
            height - 16.0,
            ms(t)
        );
    }
    // Faults: shaded bands across every lane.
    let shown = history
        .faults
        .iter()
        .filter(|f| f.ended >= t0 && f.started <= t1);
    for (i, f) in shown.enumerate() {
        let label_y = TOP - 8.0 - 10.0 * (i % LABEL_ROWS) as f64;
        let (a, b) = (x(f.started), x(f.ended).max(x(f.started) + 2.0));
        // A paused holder is one owner's fault: shade only its lanes.
        let (band_top, band_height) = match f.kind {
            FaultKind::HolderPause | FaultKind::HolderStopped | FaultKind::HolderKilled => {
                for ((_, owner), i) in &lanes {
                    if **owner == *f.target {
                        let _ = writeln!(
                            svg,
                            r##"<rect x="{a:.1}" y="{:.1}" width="{:.1}" height="{LANE}" fill="#f90" fill-opacity="0.25"><title>{}</title></rect>"##,
                            TOP + LANE * *i as f64,
                            b - a,
                            escape(&format!(
                                "{} of {} {:.3}..{:.3}ms",
                                f.kind.name(),
                                f.target,
                                ms(f.started),
                                ms(f.ended)
                            ))
                        );
                    }
                }
                continue;
            }
            _ => (TOP - 6.0, height - TOP - 24.0),
        };
        let _ = writeln!(
            svg,
            r##"<rect x="{a:.1}" y="{}" width="{:.1}" height="{}" fill="#f90" fill-opacity="0.18"><title>{}</title></rect><text x="{a:.1}" y="{}" fill="#c60" font-size="9">{}</text>"##,
            band_top,
            b - a,
            band_height,
            escape(&format!(
                "{} on {} {:.3}..{:.3}ms",
                f.kind.name(),
                f.target,
                ms(f.started),
                ms(f.ended)
            )),
            label_y,
            escape(f.kind.name())
        );
    }
    // Restarts of every client: a line across every lane, labelled with
    // the new epoch (and the rewind it accepted).
    for r in history.restarts.iter().filter(|r| r.at >= t0 && r.at <= t1) {
        let accepts = history
            .rewinds
            .iter()
            .find(|w| w.accepted_by == Some(r.epoch))
            .map_or(String::new(), |w| {
                format!(", accepting the rewind of {}", w.target)
            });
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="#a0c" stroke-width="1.5"><title>{3}</title></line>"##,
            x(r.at),
            TOP - 6.0,
            height - 30.0,
            escape(&format!(
                "clients restarted at {:.3}ms: epoch {}{accepts}",
                ms(r.at),
                r.epoch
            ))
        );
    }
    // Lane labels and guides.
    for ((session, owner), i) in &lanes {
        let ly = TOP + LANE * *i as f64;
        let _ = writeln!(
            svg,
            r##"<line x1="{LABEL}" y1="{0:.1}" x2="{WIDTH}" y2="{0:.1}" stroke="#f4f4f4"/><text x="6" y="{1:.1}">{2} {3}</text>"##,
            ly + LANE / 2.0,
            ly + LANE * 0.65,
            escape(session),
            escape(owner)
        );
    }
    // Holds.
    for h in holds(history) {
        if !drawn.contains(&h.op) {
            continue;
        }
        let Some(ly) = y(&h.session, &h.owner) else {
            continue;
        };
        let (a, b) = (x(h.from), x(h.until).max(x(h.from) + 1.0));
        let _ = writeln!(
            svg,
            r#"<rect x="{a:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.75"><title>{}</title></rect>"#,
            ly + 3.0,
            b - a,
            LANE - 6.0,
            colour(h.token),
            escape(&format!(
                "token {} held {:.3}..{:.3}ms (op #{})",
                h.token,
                ms(h.from),
                ms(h.until),
                h.op
            ))
        );
        if b - a > 24.0 {
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="9">{}</text>"#,
                a + 2.0,
                ly + LANE * 0.62,
                h.token
            );
        }
    }
    // Writes and refused or unanswered lease calls.
    for op in window {
        let Some(ly) = y(&op.session, &op.owner) else {
            continue;
        };
        let title = escape(&op.to_string());
        let at = x(op.completed);
        match (op.kind, op.outcome) {
            (OpKind::Write, outcome) => {
                let colour = match outcome {
                    Outcome::Done => "#080",
                    Outcome::Fenced => "#d00",
                    Outcome::Rewound => "#a0c",
                    _ => "#888",
                };
                let _ = writeln!(
                    svg,
                    r#"<line x1="{at:.1}" y1="{:.1}" x2="{at:.1}" y2="{:.1}" stroke="{colour}" stroke-width="1.5"><title>{title}</title></line>"#,
                    ly + 1.0,
                    ly + LANE - 1.0
                );
            }
            (_, Outcome::Held | Outcome::Ambiguous(_) | Outcome::Rewound) => {
                let fill = match op.outcome {
                    Outcome::Held => "#bbb",
                    Outcome::Rewound => "#a0c",
                    _ => "#555",
                };
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{at:.1}" cy="{:.1}" r="2" fill="{fill}"><title>{title}</title></circle>"#,
                    ly + LANE / 2.0
                );
            }
            _ => {}
        }
    }
    // The first violation.
    if let Some(v) = &verdict.first {
        for op in window.iter().filter(|op| v.ops.contains(&op.id)) {
            let Some(ly) = y(&op.session, &op.owner) else {
                continue;
            };
            let (a, b) = (x(op.invoked) - 3.0, x(op.completed) + 3.0);
            let _ = writeln!(
                svg,
                r#"<rect x="{a:.1}" y="{:.1}" width="{:.1}" height="{LANE}" fill="none" stroke="red" stroke-width="2.5"><title>{}</title></rect>"#,
                ly,
                (b - a).max(6.0),
                escape(&v.message)
            );
        }
        let vx = x(v.at);
        let _ = writeln!(
            svg,
            r#"<line x1="{vx:.1}" y1="{}" x2="{vx:.1}" y2="{}" stroke="red" stroke-dasharray="4 3"/><text x="8" y="48" fill="red">{}</text>"#,
            TOP - 6.0,
            height - 30.0,
            escape(&format!("first violation ({}): {}", v.property, v.message))
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn summary(verdict: &Verdict) -> String {
    let mut s = format!(
        "{} operations, {} faults, {} violations",
        verdict.ops,
        verdict.fault_total(),
        verdict.total()
    );
    for (p, n) in &verdict.violations {
        let _ = write!(s, " {p}={n}");
    }
    s
}

/// Neighbouring tokens get far-apart hues.
fn colour(token: u64) -> String {
    format!("hsl({},65%,55%)", (token.wrapping_mul(137) % 360))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
