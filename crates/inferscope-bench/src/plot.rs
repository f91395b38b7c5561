//! The sweep's charts as files: the SVG of `inferscope_charts` (shared with
//! the console), and the PNG, that same SVG rasterised by `resvg` with the
//! DejaVu Sans font shipped in `assets/fonts/` (embedded, so no system font is
//! needed and the two files match). Pure Rust, no system libraries.

use crate::error::BenchError;
use inferscope_charts::FONT_FAMILY;
pub use inferscope_charts::{Chart, H, Series, W, nice_step, svg};
use std::sync::Arc;

/// The font every chart is drawn with (licence: `assets/fonts/LICENSE-DejaVu.txt`).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

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
    use inferscope_charts::{BOTTOM, LEFT, RIGHT, TOP};

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
}
