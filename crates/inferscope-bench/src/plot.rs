//! Line charts as SVG (with text) and PNG (same geometry, text-free: no font
//! is shipped; the SVG carries the labels). Pure Rust, no system libraries.

use crate::error::BenchError;
use std::fmt::Write;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points, drawn in order.
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels and series.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title.
    pub title: String,
    /// X-axis label.
    pub x_label: String,
    /// Y-axis label.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

const W: u32 = 800;
const H: u32 = 500;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [(u8, u8, u8); 6] = [
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
];

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

/// Maps data to pixels.
struct Frame {
    x_max: f64,
    x_step: f64,
    y_max: f64,
    y_step: f64,
}

impl Frame {
    fn new(chart: &Chart) -> Self {
        let pts = chart.series.iter().flat_map(|s| s.points.iter());
        let (mut xm, mut ym) = (0.0f64, 0.0f64);
        for &(x, y) in pts {
            if x.is_finite() {
                xm = xm.max(x);
            }
            if y.is_finite() {
                ym = ym.max(y);
            }
        }
        let (x_max, x_step) = axis(xm);
        let (y_max, y_step) = axis(ym);
        Frame {
            x_max,
            x_step,
            y_max,
            y_step,
        }
    }
    fn px(&self, x: f64) -> f64 {
        LEFT + x / self.x_max * (f64::from(W) - LEFT - RIGHT)
    }
    fn py(&self, y: f64) -> f64 {
        f64::from(H) - BOTTOM - y / self.y_max * (f64::from(H) - TOP - BOTTOM)
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
}

fn tick_label(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// Renders the chart as SVG.
pub fn svg(chart: &Chart) -> String {
    let f = Frame::new(chart);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="16">{}</text>"#,
        W / 2,
        esc(&chart.title)
    );
    for t in Frame::ticks(f.x_max, f.x_step) {
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
            tick_label(t)
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
            tick_label(t)
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#333"/>"##,
        f.py(0.0),
        f.px(f.x_max)
    );
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333"/>"##,
        f.py(0.0)
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
        (LEFT + f64::from(W) - RIGHT) / 2.0,
        H - 15,
        esc(&chart.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="{0:.1}" text-anchor="middle" transform="rotate(-90 20 {0:.1})">{1}</text>"#,
        (TOP + f64::from(H) - BOTTOM) / 2.0,
        esc(&chart.y_label)
    );
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
        for p in &pts {
            if let Some((x, y)) = p.split_once(',') {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{x}" cy="{y}" r="4" fill="rgb({r},{g},{b})"/>"#
                );
            }
        }
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let lx = LEFT + 15.0;
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
    }
    s.push_str("</svg>\n");
    s
}

/// An RGB canvas.
struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Self {
        Canvas {
            px: vec![255; (W * H * 3) as usize],
        }
    }
    fn set(&mut self, x: i64, y: i64, c: (u8, u8, u8)) {
        if x < 0 || y < 0 || x >= i64::from(W) || y >= i64::from(H) {
            return;
        }
        let i = ((y as usize) * W as usize + x as usize) * 3;
        self.px[i] = c.0;
        self.px[i + 1] = c.1;
        self.px[i + 2] = c.2;
    }
    fn dot(&mut self, x: f64, y: f64, r: i64, c: (u8, u8, u8)) {
        let (cx, cy) = (x.round() as i64, y.round() as i64);
        for dy in -r..=r {
            for dx in -r..=r {
                if dx * dx + dy * dy <= r * r {
                    self.set(cx + dx, cy + dy, c);
                }
            }
        }
    }
    fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), width: i64, c: (u8, u8, u8)) {
        let steps = (x1 - x0).abs().max((y1 - y0).abs()).ceil().max(1.0) as usize;
        for i in 0..=steps {
            let t = i as f64 / steps as f64;
            self.dot(x0 + (x1 - x0) * t, y0 + (y1 - y0) * t, width / 2, c);
        }
    }
}

/// Renders the chart as PNG bytes (axes, grid, lines and points; no text).
pub fn png(chart: &Chart) -> Result<Vec<u8>, BenchError> {
    let f = Frame::new(chart);
    let mut c = Canvas::new();
    let grid = (224, 224, 224);
    for t in Frame::ticks(f.x_max, f.x_step) {
        c.line((f.px(t), TOP), (f.px(t), f.py(0.0)), 1, grid);
    }
    for t in Frame::ticks(f.y_max, f.y_step) {
        c.line((LEFT, f.py(t)), (f.px(f.x_max), f.py(t)), 1, grid);
    }
    let axis_c = (51, 51, 51);
    c.line((LEFT, f.py(0.0)), (f.px(f.x_max), f.py(0.0)), 2, axis_c);
    c.line((LEFT, TOP), (LEFT, f.py(0.0)), 2, axis_c);
    for (i, series) in chart.series.iter().enumerate() {
        let col = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = series
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| (f.px(x), f.py(y)))
            .collect();
        for w in pts.windows(2) {
            c.line(w[0], w[1], 2, col);
        }
        for &(x, y) in &pts {
            c.dot(x, y, 4, col);
        }
        // Legend swatch (colour order matches the SVG legend).
        let ly = TOP + 10.0 + 18.0 * i as f64;
        c.line((LEFT + 15.0, ly), (LEFT + 35.0, ly), 3, col);
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, W, H);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc
            .write_header()
            .map_err(|e| BenchError::Plot(e.to_string()))?;
        w.write_image_data(&c.px)
            .map_err(|e| BenchError::Plot(e.to_string()))?;
    }
    Ok(out)
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
    fn png_is_valid_and_has_colour() {
        let bytes = png(&chart()).expect("png");
        let dec = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = dec.read_info().expect("header");
        let mut buf = vec![0; reader.output_buffer_size().expect("size")];
        let info = reader.next_frame(&mut buf).expect("frame");
        assert_eq!((info.width, info.height), (W, H));
        let blue = buf.chunks(3).filter(|p| p == &[31, 119, 180]).count();
        assert!(blue > 100, "series pixels: {blue}");
    }
}
