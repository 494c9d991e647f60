//! What every chart shares: sizes, the palette, the embedded font and text styles.

use std::sync::OnceLock;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

pub(super) const FONT: &str = "sans-serif";
pub(super) const W: u32 = 1400;
pub(super) const H: u32 = 800;
/// Bars beyond this many steps would be thinner than a pixel: plot the last ones.
pub(super) const MAX_STEPS_PLOTTED: usize = 200;
/// Sections named in bar charts; the rest are summed into "(other)" or left out.
pub(super) const MAX_SECTIONS: usize = 16;

/// Tableau 20, a palette made for telling categories apart.
const PALETTE: [(u8, u8, u8); 20] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (174, 199, 232),
    (255, 187, 120),
    (152, 223, 138),
    (255, 152, 150),
    (197, 176, 213),
    (196, 156, 148),
    (247, 182, 210),
    (199, 199, 199),
    (219, 219, 141),
    (158, 218, 229),
];

pub(super) fn color(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

pub(super) fn fonts() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the embedded regular font is invalid".to_string())?;
        plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold())
            .map_err(|_| "the embedded bold font is invalid".to_string())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

pub(super) fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e:?}")
}

pub(super) type Area<'a, DB> = DrawingArea<DB, Shift>;

pub(super) fn title_style() -> TextStyle<'static> {
    (FONT, 28).into_font().style(FontStyle::Bold).into()
}

pub(super) fn label_font() -> FontDesc<'static> {
    (FONT, 18).into_font()
}
