//! Reads the rows of a small result frame (a breakdown's sections, steps, queue sides)
//! into structs that derive `Deserialize`, one field per column of the same name, so no
//! caller zips columns by hand. The frames come from the aggregations in `queries` and
//! hold tens to thousands of rows, never the spans themselves.
//!
//! A cell reads as its field wants it: a missing value (null, or a float that is not
//! finite) is `None` for an `Option`, and 0, `""` or `false` otherwise; numbers convert
//! between integer and float columns; strings come from string and enum columns; a unit
//! enum (such as [`Clock`](chrome_trace_format::Clock)) from its string.

use polars::prelude::*;
use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};
use serde::{forward_to_deserialize_any, Deserialize, Deserializer};

/// Every row of `df` as a `T`.
pub fn rows<T: DeserializeOwned>(df: &DataFrame) -> PolarsResult<Vec<T>> {
    (0..df.height())
        .map(|i| {
            T::deserialize(RowDe { df, row: i })
                .map_err(|e| polars_err!(ComputeError: "row {i}: {}", e.0))
        })
        .collect()
}

/// For `#[serde(deserialize_with)]`: a missing value reads as NaN (a ratio without a
/// denominator).
pub fn nan_if_missing<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// For `#[serde(deserialize_with)]`: a missing value reads as -1 (no step).
pub fn minus_one_if_missing<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    Ok(Option::<i64>::deserialize(d)?.unwrap_or(-1))
}

/// A deserialization error: a message.
#[derive(Debug)]
pub struct RowError(String);

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RowError {}

impl de::Error for RowError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        RowError(msg.to_string())
    }
}

fn polars_error(e: PolarsError) -> RowError {
    RowError(e.to_string())
}

/// One row, deserialized as a struct whose fields name columns.
struct RowDe<'a> {
    df: &'a DataFrame,
    row: usize,
}

impl<'de> de::Deserializer<'de> for RowDe<'_> {
    type Error = RowError;

    fn deserialize_any<V: Visitor<'de>>(self, _v: V) -> Result<V::Value, RowError> {
        Err(de::Error::custom("a row reads only as a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RowError> {
        visitor.visit_map(Cells {
            df: self.df,
            row: self.row,
            fields,
            next: 0,
        })
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The cells of one row, in the order of the struct's fields.
struct Cells<'a> {
    df: &'a DataFrame,
    row: usize,
    fields: &'static [&'static str],
    next: usize,
}

impl<'de> de::MapAccess<'de> for Cells<'_> {
    type Error = RowError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, RowError> {
        let Some(field) = self.fields.get(self.next) else {
            return Ok(None);
        };
        seed.deserialize((*field).into_deserializer()).map(Some)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, RowError> {
        let field = self.fields[self.next];
        self.next += 1;
        let column = self.df.column(field).map_err(polars_error)?;
        let value = column.get(self.row).map_err(polars_error)?;
        seed.deserialize(Cell(value))
    }
}

/// One cell.
struct Cell<'a>(AnyValue<'a>);

impl Cell<'_> {
    /// The value as a finite number; `None` for null, non-finite or non-numeric values.
    fn number(&self) -> Option<f64> {
        self.0.extract::<f64>().filter(|x| x.is_finite())
    }

    fn text(&self) -> Option<&str> {
        self.0.get_str()
    }

    fn missing(&self) -> bool {
        match &self.0 {
            AnyValue::Null => true,
            AnyValue::Float32(x) => !x.is_finite(),
            AnyValue::Float64(x) => !x.is_finite(),
            _ => false,
        }
    }
}

impl<'de> de::Deserializer<'de> for Cell<'_> {
    type Error = RowError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        match &self.0 {
            AnyValue::Boolean(b) => v.visit_bool(*b),
            _ if self.missing() => v.visit_none(),
            _ => match (self.text(), self.0.extract::<i64>(), self.number()) {
                (Some(s), ..) => v.visit_str(s),
                (None, Some(i), _) if self.0.dtype().is_integer() => v.visit_i64(i),
                (None, _, Some(x)) => v.visit_f64(x),
                _ => Err(de::Error::custom(format!("cannot read {:?}", self.0))),
            },
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        if self.missing() {
            v.visit_none()
        } else {
            v.visit_some(self)
        }
    }

    fn deserialize_f64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        v.visit_f64(self.number().unwrap_or(0.0))
    }

    fn deserialize_f32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        self.deserialize_f64(v)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        v.visit_i64(self.0.extract::<i64>().unwrap_or(0))
    }

    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        // As the `i64` it is stored as, then cast (a negative count reads as it did).
        v.visit_u64(self.0.extract::<i64>().unwrap_or(0) as u64)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        v.visit_bool(matches!(self.0, AnyValue::Boolean(true)))
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        v.visit_str(self.text().unwrap_or(""))
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, RowError> {
        self.deserialize_str(v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, RowError> {
        let s = self.text().unwrap_or("").to_string();
        v.visit_enum(s.into_deserializer())
    }

    forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u32 u128 char bytes byte_buf unit unit_struct
        newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use chrome_trace_format::Clock;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Row {
        name: String,
        kind: Clock,
        count: u64,
        total: f64,
        ratio: Option<f64>,
        top: bool,
    }

    #[test]
    fn cells_read_as_their_fields_want() {
        let df = df![
            "name" => [Some("a"), None],
            "kind" => ["cpu", "gpu"],
            "count" => [3i64, 4],
            "total" => [Some(1.5f64), Some(f64::NAN)],
            "ratio" => [Some(2.0f64), None],
            "top" => [Some(true), None],
            "unused" => [0i32, 1],
        ]
        .unwrap();
        let got: Vec<Row> = rows(&df).unwrap();
        assert_eq!(
            got,
            vec![
                Row {
                    name: "a".into(),
                    kind: Clock::Cpu,
                    count: 3,
                    total: 1.5,
                    ratio: Some(2.0),
                    top: true,
                },
                Row {
                    name: "".into(),
                    kind: Clock::Gpu,
                    count: 4,
                    total: 0.0,
                    ratio: None,
                    top: false,
                },
            ]
        );
        // Numbers convert between integer and float columns.
        #[derive(Deserialize)]
        struct Cast {
            count: f64,
            total: Option<i64>,
        }
        let c: Vec<Cast> = rows(&df).unwrap();
        assert_eq!((c[0].count, c[0].total), (3.0, Some(1)));
        assert!(rows::<Row>(&df.drop("kind").unwrap()).is_err());
        #[derive(Deserialize)]
        struct Missing {
            #[serde(deserialize_with = "nan_if_missing")]
            ratio: f64,
            #[serde(deserialize_with = "minus_one_if_missing")]
            name: i64,
        }
        let m: Vec<Missing> = rows(
            &df.select(["ratio"])
                .unwrap()
                .hstack(&[Column::new("name".into(), [None::<i64>, Some(7)])])
                .unwrap(),
        )
        .unwrap();
        assert!(m[1].ratio.is_nan() && m[0].ratio == 2.0);
        assert_eq!((m[0].name, m[1].name), (-1, 7));
    }
}
