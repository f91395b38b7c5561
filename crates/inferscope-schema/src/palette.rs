//! The colours of chart series, in order. The bench's HTML report and the
//! server's console draw with these same ones, so a figure in one reads like
//! the other; both link this crate and neither may link the other.

/// Series colours (RGB), in the order series are drawn: matplotlib's
/// "tab10" first six.
pub const SERIES: [(u8, u8, u8); 6] = [
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
];

/// `#rrggbb` of a colour.
pub fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_css() {
        assert_eq!(super::hex(super::SERIES[0]), "#1f77b4");
        assert_eq!(super::hex((255, 0, 10)), "#ff000a");
    }
}
