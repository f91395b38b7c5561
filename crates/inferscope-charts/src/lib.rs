//! Line charts drawn as SVG (title, axis names with units, tick values,
//! legend), in the series colours of `inferscope_schema::palette`: the one
//! drawing code of the bench's report and PNGs (which rasterise this SVG) and
//! of the live console, so a chart in one looks like the other.

use std::fmt::Write;

/// The font family every chart asks for first (the bench rasterises with
/// this font, shipped in its `assets/fonts/`).
pub const FONT_FAMILY: &str = "DejaVu Sans";

/// One line of a chart.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points, drawn in order.
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels and series.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// Title.
    pub title: String,
    /// X-axis label.
    pub x_label: String,
    /// Y-axis label.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Lines only, no dot per point (dense series: CDFs, time series).
    pub lines_only: bool,
    /// A dashed vertical line at this x with this label (e.g. a saturation point).
    pub marker: Option<(f64, String)>,
    /// Right end of the x axis (so charts of one run share their time axis);
    /// default: from the data.
    pub x_max: Option<f64>,
    /// The x values are unix seconds: the axis spans the data (not from 0)
    /// and its ticks are clock times (`HH:MM:SS`) at this offset from UTC,
    /// in seconds. `None`: a numeric axis from 0.
    pub clock: Option<i64>,
    /// Formats y values (tick labels and hover text); default: the tick's
    /// decimals, and hover values to 4 significant digits.
    pub y_format: Option<fn(f64) -> String>,
    /// The hover text of each point, by series then point, where the value
    /// alone does not say it (e.g. "> 10 s" drawn at the last bound);
    /// missing entries fall back to [`Chart::y_format`].
    pub labels: Vec<Vec<String>>,
    /// Hover tooltips: one transparent band per x value whose `<title>`
    /// names the x and every series' exact value there.
    pub hover: bool,
    /// Width and height in pixels; default [`W`]×[`H`]. The SVG scales to
    /// its box (`viewBox`), so this sets the text's size relative to it.
    pub size: Option<(u32, u32)>,
}

/// Width of every chart, pixels.
pub const W: u32 = 800;
/// Height of every chart, pixels.
pub const H: u32 = 500;
/// Left margin (y tick values and label), pixels.
pub const LEFT: f64 = 80.0;
/// Right margin, pixels.
pub const RIGHT: f64 = 30.0;
/// Top margin (title and legend), pixels.
pub const TOP: f64 = 60.0;
/// Bottom margin (x tick values and label), pixels.
pub const BOTTOM: f64 = 60.0;
/// The series colours the console shares.
const COLORS: [(u8, u8, u8); 6] = inferscope_schema::palette::SERIES;

/// A tick step of 1, 2 or 5 × 10^k giving about `n` intervals.
pub fn nice_step(range: f64, n: f64) -> f64 {
    if range.is_nan() || range <= 0.0 || !range.is_finite() {
        return 1.0;
    }
    let raw = range / n;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Axis range from 0 to a nice maximum, with its tick step.
fn axis(max: f64) -> (f64, f64) {
    let max = if max > 0.0 && max.is_finite() {
        max
    } else {
        1.0
    };
    let step = nice_step(max, 5.0);
    ((max / step).ceil() * step, step)
}

/// A clock-axis tick step, seconds: the first of these giving at most
/// about `n` intervals.
fn clock_step(range: f64, n: f64) -> f64 {
    const STEPS: [f64; 14] = [
        1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0,
    ];
    STEPS
        .into_iter()
        .find(|s| range / s <= n)
        .unwrap_or_else(|| nice_step(range, n))
}

/// `HH:MM:SS` of unix seconds `t` at `offset` seconds from UTC.
pub fn clock_label(t: f64, offset: i64) -> String {
    let day = (t.round() as i64 + offset).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", day / 3600, day / 60 % 60, day % 60)
}

/// A hover value: 4 significant digits, no exponent.
fn value_label(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let decimals = (3 - v.abs().log10().floor() as i64).clamp(0, 9) as usize;
    format!("{v:.decimals$}")
}

/// Maps data to pixels.
struct Frame {
    w: f64,
    h: f64,
    x_min: f64,
    x_max: f64,
    x_ticks: Vec<f64>,
    x_step: f64,
    y_max: f64,
    y_step: f64,
}

impl Frame {
    fn new(chart: &Chart) -> Self {
        let (w, h) = chart.size.unwrap_or((W, H));
        let pts = chart.series.iter().flat_map(|s| s.points.iter());
        let (mut xm, mut ym) = (0.0f64, 0.0f64);
        let mut x_first = f64::INFINITY;
        for &(x, y) in pts {
            if x.is_finite() {
                xm = xm.max(x);
                x_first = x_first.min(x);
            }
            if y.is_finite() {
                ym = ym.max(y);
            }
        }
        if let Some((x, _)) = chart.marker.as_ref().filter(|(x, _)| x.is_finite()) {
            xm = xm.max(*x);
        }
        if let Some(x) = chart.x_max.filter(|x| x.is_finite() && *x > 0.0) {
            xm = x;
        }
        let (y_max, y_step) = axis(ym);
        let (x_min, x_max, x_step, x_ticks) = match chart.clock {
            Some(offset) => {
                // Time runs from the first point to the last; ticks fall on
                // round clock times within it.
                let x_min = if x_first.is_finite() { x_first } else { xm };
                let x_max = if xm > x_min { xm } else { x_min + 1.0 };
                let step = clock_step(x_max - x_min, 5.0);
                let local = |t: f64| t + offset as f64;
                let first = (local(x_min) / step).ceil() * step - offset as f64;
                let n = ((x_max - first) / step).floor().max(-1.0) as i64;
                let ticks = (0..=n).map(|i| first + i as f64 * step).collect();
                (x_min, x_max, step, ticks)
            }
            None => {
                let (x_max, x_step) = axis(xm);
                (0.0, x_max, x_step, Self::ticks(x_max, x_step))
            }
        };
        Frame {
            w: f64::from(w),
            h: f64::from(h),
            x_min,
            x_max,
            x_ticks,
            x_step,
            y_max,
            y_step,
        }
    }
    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x_min) / (self.x_max - self.x_min) * (self.w - LEFT - RIGHT)
    }
    fn py(&self, y: f64) -> f64 {
        self.h - BOTTOM - y / self.y_max * (self.h - TOP - BOTTOM)
    }
    fn ticks(max: f64, step: f64) -> Vec<f64> {
        let n = (max / step).round() as usize;
        (0..=n).map(|i| i as f64 * step).collect()
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A tick value with as many decimals as the step needs (no `0.6000000000000001`).
fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()).clamp(0.0, 9.0) as usize
    };
    format!("{v:.decimals$}")
}

/// Renders the chart as SVG.
pub fn svg(chart: &Chart) -> String {
    let f = Frame::new(chart);
    let (w, h) = (f.w, f.h);
    let y_text = |v: f64| {
        chart
            .y_format
            .map_or_else(|| tick_label(v, f.y_step), |fmt| fmt(v))
    };
    let x_text = |v: f64| match chart.clock {
        Some(offset) => clock_label(v, offset),
        None => tick_label(v, f.x_step),
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT_FAMILY}, sans-serif" font-size="12" fill="#222">"##
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="16">{}</text>"#,
        w / 2.0,
        esc(&chart.title)
    );
    for &t in &f.x_ticks {
        let x = f.px(t);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e0e0e0"/>"##,
            f.py(0.0)
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            f.py(0.0) + 18.0,
            x_text(t)
        );
    }
    for t in Frame::ticks(f.y_max, f.y_step) {
        let y = f.py(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>"##,
            f.px(f.x_max)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            esc(&y_text(t))
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#333" stroke-width="2"/>"##,
        f.py(0.0),
        f.px(f.x_max)
    );
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333" stroke-width="2"/>"##,
        f.py(0.0)
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
        (LEFT + w - RIGHT) / 2.0,
        h - 15.0,
        esc(&chart.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="{0:.1}" text-anchor="middle" transform="rotate(-90 20 {0:.1})">{1}</text>"#,
        (TOP + h - BOTTOM) / 2.0,
        esc(&chart.y_label)
    );
    if let Some((x, label)) = chart.marker.as_ref().filter(|(x, _)| x.is_finite()) {
        let px = f.px(*x);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#555" stroke-width="1.5" stroke-dasharray="6 4"/>"##,
            f.py(0.0)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            px - 4.0,
            TOP + 14.0,
            esc(label)
        );
    }
    // The legend sits in its own band between the title and the plot, so it
    // never hides data.
    let mut lx = LEFT;
    let ly = TOP - 14.0;
    for (i, series) in chart.series.iter().enumerate() {
        let (r, g, b) = COLORS[i % COLORS.len()];
        let pts: Vec<String> = series
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", f.px(x), f.py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="rgb({r},{g},{b})" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        if !chart.lines_only {
            for p in &pts {
                if let Some((x, y)) = p.split_once(',') {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{x}" cy="{y}" r="4" fill="rgb({r},{g},{b})"/>"#
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="rgb({r},{g},{b})" stroke-width="3"/>"#,
            lx + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 26.0,
            ly + 4.0,
            esc(&series.name)
        );
        // About 7 px per character at 12 px DejaVu Sans.
        lx += 26.0 + 7.0 * series.name.chars().count() as f64 + 18.0;
    }
    if chart.hover {
        hover_bands(&mut s, chart, &f, &x_text);
    }
    s.push_str("</svg>\n");
    s
}

/// One transparent band per distinct x (in a `<g class="hover">`), from halfway to the previous x to
/// halfway to the next, whose `<title>` (the browser's tooltip) names the x
/// and each series' exact value there. Drawn last, so it is on top.
fn hover_bands(s: &mut String, chart: &Chart, f: &Frame, x_text: &dyn Fn(f64) -> String) {
    // Every finite point as (x, series, index), in x then series order: one
    // sort, then each x's points are a run (no search per x).
    let mut points: Vec<(f64, usize, usize)> = chart
        .series
        .iter()
        .enumerate()
        .flat_map(|(i, series)| {
            series
                .points
                .iter()
                .enumerate()
                .filter(|(_, p)| p.0.is_finite() && p.1.is_finite())
                .map(move |(j, p)| (p.0, i, j))
        })
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let runs: Vec<&[(f64, usize, usize)]> = points.chunk_by(|a, b| a.0 == b.0).collect();
    // Painted (so it takes the pointer) but invisible; one group carries
    // the paint so each band stays short.
    let _ = writeln!(s, r##"<g class="hover" fill="#000" fill-opacity="0">"##);
    for (k, run) in runs.iter().enumerate() {
        let x = run[0].0;
        let lo = if k == 0 {
            f.x_min
        } else {
            (runs[k - 1][0].0 + x) / 2.0
        };
        let hi = runs
            .get(k + 1)
            .map_or(f.x_max, |next| (x + next[0].0) / 2.0);
        let mut title = x_text(x);
        // A series with two points at one x shows its first.
        for (n, &(_, i, j)) in run.iter().enumerate() {
            if n > 0 && run[n - 1].1 == i {
                continue;
            }
            let y = chart.series[i].points[j].1;
            let value = chart
                .labels
                .get(i)
                .and_then(|l| l.get(j))
                .cloned()
                .unwrap_or_else(|| chart.y_format.map_or_else(|| value_label(y), |fmt| fmt(y)));
            let _ = write!(title, "\n{}: {value}", chart.series[i].name);
        }
        let _ = writeln!(
            s,
            r#"<rect data-x="{x}" x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}"><title>{}</title></rect>"#,
            f.px(lo),
            (f.px(hi) - f.px(lo)).max(0.0),
            f.py(0.0) - TOP,
            esc(&title)
        );
    }
    s.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "TTFT <vs> throughput".into(),
            x_label: "tok/s".into(),
            y_label: "ms".into(),
            series: vec![
                Series {
                    name: "median".into(),
                    points: vec![(100.0, 10.0), (200.0, 12.0), (390.0, 40.0)],
                },
                Series {
                    name: "P99".into(),
                    points: vec![(100.0, 20.0), (200.0, 30.0), (390.0, f64::NAN)],
                },
            ],
            ..Chart::default()
        }
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(390.0, 5.0), 100.0);
        assert_eq!(nice_step(9.0, 5.0), 2.0);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
        assert_eq!(axis(390.0), (400.0, 100.0));
    }

    #[test]
    fn svg_has_series_and_escapes() {
        let s = svg(&chart());
        assert!(s.starts_with("<svg"));
        assert!(s.contains("TTFT &lt;vs&gt; throughput"));
        assert_eq!(s.matches("<polyline").count(), 2);
        // 3 + 2 finite points.
        assert_eq!(s.matches("<circle").count(), 5);
        assert!(!s.contains("NaN"));
    }

    #[test]
    fn tick_labels_have_the_decimals_of_the_step() {
        assert_eq!(tick_label(0.6000000000000001, 0.2), "0.6");
        assert_eq!(tick_label(0.05, 0.05), "0.05");
        assert_eq!(tick_label(300.0, 100.0), "300");
    }

    /// Two series over three clock times (unix seconds), hovering on.
    fn clock_chart() -> Chart {
        Chart {
            series: vec![
                Series {
                    name: "prompt".into(),
                    points: vec![(3600.0, 1.5), (3601.0, 2.25), (3602.0, 1234.5678)],
                },
                Series {
                    name: "bound".into(),
                    points: vec![(3600.0, 0.5), (3601.0, f64::NAN), (3602.0, 10.0)],
                },
            ],
            clock: Some(-1800),
            labels: vec![
                vec![],
                vec!["<= 0.5 s".into(), String::new(), "> 10 s".into()],
            ],
            hover: true,
            size: Some((480, 300)),
            ..Chart::default()
        }
    }

    #[test]
    fn a_clock_axis_spans_the_data_with_clock_ticks() {
        let s = svg(&clock_chart());
        assert!(s.contains(r#"viewBox="0 0 480 300""#), "{s}");
        // 01:00:00 UTC at UTC-0:30.
        assert!(s.contains(">00:30:00</text>"), "{s}");
        assert!(s.contains(">00:30:02</text>"), "{s}");
        // The first point sits on the y axis, the last at the right end.
        let first = format!("{LEFT:.1},");
        assert!(s.contains(&format!(r#"points="{first}"#)), "{s}");
        assert!(s.contains(&format!(" {:.1},", 480.0 - RIGHT)), "{s}");
        assert_eq!(clock_label(86_399.6, 0), "00:00:00");
        assert_eq!(clock_label(0.0, -3600), "23:00:00");
    }

    #[test]
    fn hover_bands_carry_each_series_exact_value() {
        let s = svg(&clock_chart());
        let titles: Vec<&str> = s
            .split("<title>")
            .skip(1)
            .map(|t| &t[..t.find("</title>").unwrap_or(0)])
            .collect();
        assert_eq!(
            titles,
            [
                "00:30:00\nprompt: 1.500\nbound: &lt;= 0.5 s",
                "00:30:01\nprompt: 2.250",
                "00:30:02\nprompt: 1235\nbound: &gt; 10 s",
            ]
        );
        // The bands tile the plot: the first starts at the y axis, the last
        // ends at the right end.
        assert!(s.contains(&format!(r#"x="{LEFT:.1}" y="{TOP}""#)), "{s}");
        // Off by default: the bench's charts stay as they were.
        assert!(!svg(&chart()).contains("<title>"));
        assert_eq!(value_label(0.012345), "0.01235");
    }
}
