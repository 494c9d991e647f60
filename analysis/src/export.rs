//! Writes the frames of a run as Parquet or CSV files, one file per frame.

use std::fs::File;
use std::path::{Path, PathBuf};

use polars::prelude::*;
use polars_io::prelude::{CsvWriter, ParquetWriter, SerWriter};

use crate::load::Trace;
use crate::queries as q;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Parquet,
    Csv,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
        }
    }
}

/// The frames written by `export`, by file stem.
pub fn frames(trace: &Trace) -> PolarsResult<Vec<(&'static str, DataFrame)>> {
    let step_total = q::step_total(&trace.spans)?;
    Ok(vec![
        ("spans", trace.spans.clone()),
        ("counters", trace.counters.clone()),
        ("flows", trace.flows.clone()),
        ("threads", trace.threads.clone()),
        (
            "sections",
            q::sections(trace.spans.clone().lazy(), step_total).collect()?,
        ),
        ("steps", q::per_step(&trace.spans)?.collect()?),
        (
            "step_sections",
            q::per_step_sections(trace.spans.clone().lazy()).collect()?,
        ),
    ])
}

/// Writes every frame into `dir`; returns the paths written.
pub fn export(trace: &Trace, format: Format, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    use anyhow::Context;
    let mut written = Vec::new();
    for (stem, mut df) in frames(trace)? {
        let path = dir.join(format!("{stem}.{}", format.ext()));
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        match format {
            Format::Parquet => {
                ParquetWriter::new(file)
                    .finish(&mut df)
                    .map_err(anyhow::Error::from)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Format::Csv => {
                // CSV has no categorical type: write names as plain strings.
                let cols = df
                    .columns()
                    .iter()
                    .map(|c| match c.dtype() {
                        DataType::Enum(..) | DataType::Categorical(..) => c.cast(&DataType::String),
                        _ => Ok(c.clone()),
                    })
                    .collect::<PolarsResult<Vec<Column>>>()?;
                let mut plain = DataFrame::new(df.height(), cols)?;
                CsvWriter::new(file)
                    .finish(&mut plain)
                    .map_err(anyhow::Error::from)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        written.push(path);
    }
    Ok(written)
}
