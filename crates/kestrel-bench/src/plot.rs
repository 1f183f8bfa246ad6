//! SVG plots drawn with plotters (SVG backend: text is emitted as SVG `<text>`,
//! so no system fonts are needed).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

fn padded_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
            (l.min(v), h.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.15).max(hi.abs() * 0.05).max(1e-9);
    ((lo - pad).max(0.0), hi + pad)
}

/// Aggregate tok/s against concurrency: each round as a point, the median as a line.
pub fn stream_curve_svg(
    path: &Path,
    title: &str,
    per_round: &[(u32, Vec<f64>)],
    medians: &[(u32, f64)],
) -> Result<()> {
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let max_c = per_round.iter().map(|(c, _)| *c).max().unwrap_or(1).max(1);
    let (_, y_hi) = padded_range(per_round.iter().flat_map(|(_, v)| v.iter().copied()));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.5f64..(max_c as f64 + 0.5), 0f64..y_hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("concurrent streams")
        .y_desc("aggregate completion tok/s")
        .x_labels(max_c as usize + 1)
        .draw()
        .map_err(err)?;
    chart
        .draw_series(per_round.iter().flat_map(|(c, vs)| {
            vs.iter()
                .map(move |v| Circle::new((*c as f64, *v), 3, BLUE.mix(0.5).filled()))
        }))
        .map_err(err)?
        .label("round")
        .legend(|(x, y)| Circle::new((x, y), 3, BLUE.mix(0.5).filled()));
    chart
        .draw_series(LineSeries::new(
            medians.iter().map(|(c, m)| (*c as f64, *m)),
            RED.stroke_width(2),
        ))
        .map_err(err)?
        .label("median")
        .legend(|(x, y)| PathElement::new(vec![(x - 10, y), (x + 10, y)], RED));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One metric per round with the reference line and its +-tolerance band.
pub fn rounds_svg(
    path: &Path,
    title: &str,
    y_desc: &str,
    values: &[f64],
    reference: Option<f64>,
    tolerance: f64,
) -> Result<()> {
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let band = reference.map(|r| (r * (1.0 - tolerance), r * (1.0 + tolerance)));
    let (y_lo, y_hi) = padded_range(
        values
            .iter()
            .copied()
            .chain(band.into_iter().flat_map(|(a, b)| [a, b])),
    );
    let n = values.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.5f64..(n as f64 + 0.5), y_lo..y_hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("round")
        .y_desc(y_desc)
        .x_labels(n + 1)
        .draw()
        .map_err(err)?;
    if let (Some(r), Some((lo, hi))) = (reference, band) {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.5, lo), (n as f64 + 0.5, hi)],
                GREEN.mix(0.15).filled(),
            )))
            .map_err(err)?
            .label(format!("reference +-{:.0}%", tolerance * 100.0))
            .legend(|(x, y)| {
                Rectangle::new([(x - 10, y - 5), (x + 10, y + 5)], GREEN.mix(0.3).filled())
            });
        chart
            .draw_series(LineSeries::new(
                [(0.5, r), (n as f64 + 0.5, r)],
                GREEN.stroke_width(2),
            ))
            .map_err(err)?;
    }
    chart
        .draw_series(LineSeries::new(
            values.iter().enumerate().map(|(i, v)| ((i + 1) as f64, *v)),
            BLUE.mix(0.4),
        ))
        .map_err(err)?;
    chart
        .draw_series(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| Circle::new(((i + 1) as f64, *v), 4, BLUE.filled())),
        )
        .map_err(err)?
        .label("measured")
        .legend(|(x, y)| Circle::new((x, y), 4, BLUE.filled()));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_svg_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("curve.svg");
        stream_curve_svg(
            &p,
            "curve",
            &[(1, vec![70.0, 71.0]), (2, vec![130.0])],
            &[(1, 70.5), (2, 130.0)],
        )
        .unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.starts_with("<svg") && s.contains("concurrent streams"));
        let p = dir.path().join("r.svg");
        rounds_svg(&p, "decode", "tok/s", &[74.0, 75.0, 73.5], Some(74.6), 0.05).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("reference"));
        rounds_svg(&p, "empty", "s", &[], None, 0.05).unwrap();
    }
}
