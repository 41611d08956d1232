//! `--plot`: one PNG per scenario with the workers running over time for the oracle and every
//! policy (left axis), and the demand in batches/s (dashed, right axis, scaled so that one
//! worker's capacity on the right lines up with one worker on the left).
//!
//! Text is drawn with `ab_glyph` from a TTF file read at run time: `$GRANARY_PLOT_FONT` when set,
//! else DejaVu Sans from its usual places (Debian's `fonts-dejavu-core`). No system font
//! libraries are needed.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use granary_policies::simulate::{Run, Scenario, ScenarioResult};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font as plotters_register_font};

/// Environment variable naming the TTF file to draw text with.
const FONT_ENV: &str = "GRANARY_PLOT_FONT";

/// Where DejaVu Sans lives on Debian/Ubuntu (`fonts-dejavu-core`), Arch and Fedora.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
];

/// The font family every text of the plot uses (plotters' default family).
const FAMILY: &str = "sans-serif";

/// Image size in pixels.
const SIZE: (u32, u32) = (1280, 720);

/// Line colours: the oracle, then the policies in order.
const ORACLE: RGBColor = RGBColor(0, 0, 0);
const POLICY_COLORS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];
const DEMAND: RGBColor = RGBColor(128, 128, 128);

/// The font file to use: `$GRANARY_PLOT_FONT` if set (it must exist), else the first DejaVu Sans
/// found.
fn find_font() -> anyhow::Result<PathBuf> {
    if let Some(value) = std::env::var_os(FONT_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if !path.is_file() {
            bail!(
                "{FONT_ENV}={} is not a file; point it at a TTF font, or unset it to use DejaVu Sans \
                 (`apt-get install fonts-dejavu-core`)",
                path.display()
            );
        }
        return Ok(path);
    }
    FONT_PATHS.iter().map(PathBuf::from).find(|p| p.is_file()).ok_or_else(|| {
        anyhow!(
            "--plot needs a TTF font and found none (looked in {}): install one with \
             `apt-get install fonts-dejavu-core`, or set {FONT_ENV} to a TTF file",
            FONT_PATHS.join(", ")
        )
    })
}

/// Finds the font and registers it as plotters' `sans-serif`. Call once per process: the font's
/// bytes are leaked, as plotters keeps a `'static` reference to them.
pub fn register_font() -> anyhow::Result<()> {
    let path = find_font()?;
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read font {}", path.display()))?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters_register_font(FAMILY, FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a usable TTF/OTF font (set {FONT_ENV} to another)", path.display()))
}

/// Draws `result` (a run of `scenario`) into the PNG file `path`.
pub fn write_png(path: &Path, scenario: &Scenario, result: &ScenarioResult) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("{e}");
    let runs: Vec<(&str, &Run)> = std::iter::once(("oracle", &result.oracle))
        .chain(result.policies.iter().map(|p| (p.policy.name(), &p.run)))
        .collect();
    let t_max = runs.iter().filter_map(|(_, r)| r.series.last()).map(|p| p.t).fold(1.0, f64::max);
    let capacity = scenario.worker_capacity();
    let capacity = if capacity > 0.0 && capacity.is_finite() { capacity } else { 1.0 };
    let demand_max = result.oracle.series.iter().map(|p| p.demand).fold(0.0, f64::max);
    let workers_max = runs.iter().flat_map(|(_, r)| &r.series).map(|p| p.workers_running).max().unwrap_or(0);
    let y_max = (f64::from(workers_max).max(demand_max / capacity) + 1.0).ceil();

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let title = format!("{}: {}", scenario.name, scenario.description);
    let root = root.titled(&title, (FAMILY, 20)).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .right_y_label_area_size(80)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(|e| err(&e))?
        .set_secondary_coord(0.0..t_max, 0.0..y_max * capacity);
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("workers running")
        .x_label_formatter(&|t| format!("{t:.0}"))
        .y_label_formatter(&|n| format!("{n:.0}"))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .configure_secondary_axes()
        .y_desc(format!("demand, batches/s (1 worker makes {capacity:.2})"))
        .y_label_formatter(&|d| format!("{d:.0}"))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()
        .map_err(|e| err(&e))?;

    let demand = result.oracle.series.iter().map(|p| (p.t, p.demand));
    chart
        .draw_secondary_series(DashedLineSeries::new(demand, 10, 6, DEMAND.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("demand of the oracle run, batches/s (right axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], DEMAND.stroke_width(2)));
    for (i, (name, run)) in runs.iter().enumerate() {
        // The oracle wide and underneath, so policies that match it stay visible on top.
        let style = match i.checked_sub(1) {
            None => ORACLE.mix(0.35).stroke_width(6),
            Some(k) => POLICY_COLORS[k % POLICY_COLORS.len()].stroke_width(2),
        };
        let points = run.series.iter().map(|p| (p.t, f64::from(p.workers_running)));
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(|e| err(&e))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
