//! Ranges the format keeps values in, so that every reader can hold them exactly.

/// `pid` and `tid` lie below 2^32 (Perfetto's importer requires it).
pub const MAX_ID: u64 = 1 << 32;
/// Flow ids lie below 2^53, the integers an `f64` (a JSON reader's number) holds exactly.
pub const MAX_FLOW_ID: u64 = 1 << 53;
