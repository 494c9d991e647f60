//! The spans frame as plain vectors: the columns that the kernel view's walks
//! ([`crate::kernels`]) and HTA's figures ([`crate::hta`]) read, taken from the frame
//! once, and the lookups along a span's parent chain (the innermost CPU section around a
//! row, and every CPU section around it).

use chrome_trace_format::{Clock, SpanKind};
use polars::prelude::*;

/// The `parent` of a span that has none.
pub(crate) const NO_ROW: u32 = u32::MAX;

/// The spans frame as plain vectors (the columns the walks need).
pub(crate) struct Cols {
    pub(crate) kind: Vec<SpanKind>,
    pub(crate) clock: Vec<Clock>,
    pub(crate) step: Vec<Option<i64>>,
    pub(crate) pid: Vec<i64>,
    pub(crate) tid: Vec<i64>,
    pub(crate) ts: Vec<f64>,
    pub(crate) dur: Vec<f64>,
    pub(crate) parent: Vec<u32>,
    pub(crate) corr: Vec<Option<f64>>,
    names: Names,
}

/// Span names: the Enum's codes and its mapping (no string column is built: casting a
/// few million names to `String` was a sixth of a breakdown's time), or the plain strings
/// when the loader could not build the Enum.
enum Names {
    Codes(Vec<u32>, std::sync::Arc<CategoricalMapping>),
    Plain(StringChunked),
}

impl Cols {
    pub(crate) fn take(spans: &DataFrame) -> PolarsResult<Cols> {
        let codes = spans
            .column("kind")?
            .as_materialized_series()
            .to_physical_repr()
            .cast(&DataType::UInt32)?;
        let kind = codes
            .u32()?
            .iter()
            .map(|c| {
                c.and_then(|c| SpanKind::ALL.get(c as usize).copied())
                    .unwrap_or(SpanKind::Other)
            })
            .collect();
        let clock = spans
            .column("clock")?
            .as_materialized_series()
            .to_physical_repr()
            .cast(&DataType::UInt32)?
            .u32()?
            .iter()
            .map(|c| {
                c.and_then(|c| Clock::ALL.get(c as usize).copied())
                    .unwrap_or(Clock::Cpu)
            })
            .collect();
        let f64s = |n: &str| -> PolarsResult<Vec<f64>> {
            Ok(spans
                .column(n)?
                .f64()?
                .iter()
                .map(|v| v.unwrap_or(0.0))
                .collect())
        };
        let i64s = |n: &str| -> PolarsResult<Vec<i64>> {
            Ok(spans
                .column(n)?
                .i64()?
                .iter()
                .map(|v| v.unwrap_or(0))
                .collect())
        };
        let name = spans.column("name")?;
        let names = match name.dtype() {
            DataType::Enum(_, mapping) | DataType::Categorical(_, mapping) => Names::Codes(
                name.as_materialized_series()
                    .to_physical_repr()
                    .cast(&DataType::UInt32)?
                    .u32()?
                    .iter()
                    .map(|c| c.unwrap_or(u32::MAX))
                    .collect(),
                mapping.clone(),
            ),
            _ => Names::Plain(name.cast(&DataType::String)?.str()?.rechunk().into_owned()),
        };
        Ok(Cols {
            kind,
            clock,
            step: spans.column("step")?.i64()?.iter().collect(),
            pid: i64s("pid")?,
            tid: i64s("tid")?,
            ts: f64s("ts")?,
            dur: f64s("dur")?,
            parent: spans
                .column("parent")?
                .u32()?
                .iter()
                .map(|p| p.unwrap_or(NO_ROW))
                .collect(),
            corr: spans.column("correlation")?.f64()?.iter().collect(),
            names,
        })
    }

    pub(crate) fn name(&self, row: usize) -> &str {
        match &self.names {
            Names::Codes(codes, mapping) => mapping.cat_to_str(codes[row]).unwrap_or(""),
            Names::Plain(s) => s.get(row).unwrap_or(""),
        }
    }

    pub(crate) fn end(&self, row: usize) -> f64 {
        self.ts[row] + self.dur[row]
    }

    /// The innermost CPU section enclosing `row` on its track (itself if it is one).
    pub(crate) fn section_of(&self, row: usize) -> Option<usize> {
        let mut r = row as u32;
        while r != NO_ROW {
            if self.kind[r as usize] == SpanKind::Cpu {
                return Some(r as usize);
            }
            r = self.parent[r as usize];
        }
        None
    }

    /// `row` and the CPU sections around it, innermost first.
    pub(crate) fn with_ancestors(&self, row: usize, out: &mut Vec<usize>) {
        out.clear();
        let mut r = row as u32;
        while r != NO_ROW {
            if self.kind[r as usize] == SpanKind::Cpu {
                out.push(r as usize);
            }
            r = self.parent[r as usize];
        }
    }
}
