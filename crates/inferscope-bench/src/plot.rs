//! Line charts drawn once as SVG (title, axis names with units, tick values,
//! legend); the PNG is that same SVG rasterised by `resvg` with the DejaVu Sans
//! font shipped in `assets/fonts/` (embedded, so no system font is needed and
//! the two files match). Pure Rust, no system libraries.

use crate::error::BenchError;
use std::fmt::Write;
use std::sync::Arc;

/// The font every chart is drawn with (licence: `assets/fonts/LICENSE-DejaVu.txt`).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
/// The family name inside [`FONT`]; the SVG asks for it first.
const FONT_FAMILY: &str = "DejaVu Sans";

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
}

/// Width of every chart, pixels.
pub const W: u32 = 800;
/// Height of every chart, pixels.
pub const H: u32 = 500;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 60.0;
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
        if let Some((x, _)) = chart.marker.as_ref().filter(|(x, _)| x.is_finite()) {
            xm = xm.max(*x);
        }
        if let Some(x) = chart.x_max.filter(|x| x.is_finite() && *x > 0.0) {
            xm = x;
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
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="{FONT_FAMILY}, sans-serif" font-size="12" fill="#222">"##
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
            tick_label(t, f.x_step)
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
            tick_label(t, f.y_step)
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
    s.push_str("</svg>\n");
    s
}

/// Options for `usvg` whose font database holds only the given font (or none).
fn options(font: Option<&[u8]>) -> resvg::usvg::Options<'static> {
    let mut opt = resvg::usvg::Options {
        font_family: FONT_FAMILY.to_string(),
        ..Default::default()
    };
    if let Some(font) = font {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_font_data(font.to_vec());
        opt.fontdb = Arc::new(db);
    }
    opt
}

/// Rasterises SVG text to RGB pixels (`W`×`H`) with the given font (none: no text drawn).
fn rasterise(svg_text: &str, font: Option<&[u8]>) -> Result<Vec<u8>, BenchError> {
    let opt = options(font);
    let tree = resvg::usvg::Tree::from_str(svg_text, &opt)
        .map_err(|e| BenchError::Plot(format!("svg: {e}")))?;
    let mut pixmap = resvg::tiny_skia::Pixmap::new(W, H)
        .ok_or_else(|| BenchError::Plot("cannot allocate the pixmap".into()))?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    // The background is opaque white, so premultiplied RGBA is plain RGBA.
    Ok(pixmap
        .data()
        .chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect())
}

fn encode_png(rgb: &[u8]) -> Result<Vec<u8>, BenchError> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, W, H);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc
            .write_header()
            .map_err(|e| BenchError::Plot(e.to_string()))?;
        w.write_image_data(rgb)
            .map_err(|e| BenchError::Plot(e.to_string()))?;
    }
    Ok(out)
}

/// Renders the chart as PNG bytes: the SVG of [`svg`], rasterised with the
/// shipped font.
pub fn png(chart: &Chart) -> Result<Vec<u8>, BenchError> {
    encode_png(&rasterise(&svg(chart), Some(FONT))?)
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

    /// Dark pixels (text, axes) inside a band of the decoded PNG.
    fn dark_pixels(rgb: &[u8], xs: std::ops::Range<u32>, ys: std::ops::Range<u32>) -> usize {
        let mut n = 0;
        for y in ys {
            for x in xs.clone() {
                let i = ((y * W + x) * 3) as usize;
                if rgb[i..i + 3].iter().all(|&c| c < 110) {
                    n += 1;
                }
            }
        }
        n
    }

    fn decode(bytes: Vec<u8>) -> Vec<u8> {
        let dec = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = dec.read_info().expect("header");
        let mut buf = vec![0; reader.output_buffer_size().expect("size")];
        reader.next_frame(&mut buf).expect("frame");
        buf
    }

    #[test]
    fn png_draws_the_text_of_the_svg() {
        let rgb = decode(png(&chart()).expect("png"));
        // Bands that hold only text (the axes and grid lie outside them).
        let title = dark_pixels(&rgb, 250..550, 8..34);
        let x_label = dark_pixels(&rgb, LEFT as u32..W - RIGHT as u32, H - 30..H - 2);
        let y_label = dark_pixels(&rgb, 4..30, TOP as u32..H - BOTTOM as u32);
        let x_ticks = dark_pixels(&rgb, LEFT as u32 - 20..W, H - BOTTOM as u32 + 4..H - 36);
        let y_ticks = dark_pixels(&rgb, 34..LEFT as u32 - 4, TOP as u32..H - BOTTOM as u32);
        let legend = dark_pixels(
            &rgb,
            LEFT as u32 + 24..LEFT as u32 + 80,
            TOP as u32 - 24..TOP as u32 - 6,
        );
        for (what, n) in [
            ("title", title),
            ("x-axis label", x_label),
            ("y-axis label", y_label),
            ("x tick values", x_ticks),
            ("y tick values", y_ticks),
            ("legend", legend),
        ] {
            assert!(n > 20, "{what}: {n} dark pixels; is the font loaded?");
        }
        // Without a font the same bands stay blank: the check can tell.
        let bare = rasterise(&svg(&chart()), None).expect("raster");
        assert_eq!(dark_pixels(&bare, 250..550, 8..34), 0);
    }

    #[test]
    fn tick_labels_have_the_decimals_of_the_step() {
        assert_eq!(tick_label(0.6000000000000001, 0.2), "0.6");
        assert_eq!(tick_label(0.05, 0.05), "0.05");
        assert_eq!(tick_label(300.0, 100.0), "300");
    }
}
