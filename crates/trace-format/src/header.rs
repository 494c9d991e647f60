//! The file around the events: one JSON object whose top-level keys other than
//! `traceEvents` are written first, in one go, and whose `traceEvents` array is the last
//! key, streamed event by event and closed by [`FOOTER`]. A file cut inside that array
//! (a writer killed between flushes) keeps every complete event before the cut.
use serde::Serialize;

/// Top-level keys (Kineto's, which tools such as Holistic Trace Analysis expect).
pub mod top {
    pub const SCHEMA_VERSION: &str = "schemaVersion";
    pub const DISPLAY_TIME_UNIT: &str = "displayTimeUnit";
    /// Unix time in ns of the trace's time zero; every `ts` is relative to it.
    pub const BASE_TIME_NS: &str = "baseTimeNanoseconds";
    pub const DISTRIBUTED_INFO: &str = "distributedInfo";
    pub const DEVICE_PROPERTIES: &str = "deviceProperties";
    pub const METADATA: &str = "metadata";
    pub const TRACE_EVENTS: &str = "traceEvents";
}

/// Keys and values of the top-level `metadata` object that the format defines (the
/// producer adds its own).
pub mod meta {
    /// Who wrote the trace ([`crate::dflash::PRODUCER`] for dflash).
    pub const PRODUCER: &str = "producer";
    pub const FORMAT: &str = "format";
    /// How GPU spans were timed: [`GPU_TIMING_CUDA_EVENTS`], or [`GPU_TIMING_NONE`] when
    /// the trace has none.
    pub const GPU_TIMING: &str = "gpu_timing";
    pub const GPU_TIMING_NONE: &str = "none";
    pub const GPU_TIMING_CUDA_EVENTS: &str = "cuda-events";
}

/// What ends the file: the `traceEvents` array and the object.
pub const FOOTER: &str = "\n]}\n";

/// `distributedInfo` (HTA requires `rank`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DistributedInfo {
    pub backend: String,
    pub rank: u32,
    pub world_size: u32,
}

impl Default for DistributedInfo {
    fn default() -> Self {
        DistributedInfo {
            backend: "none".into(),
            rank: 0,
            world_size: 1,
        }
    }
}

/// An entry of `deviceProperties`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceEntry {
    pub id: usize,
    pub name: String,
    #[serde(rename = "totalGlobalMem")]
    pub total_global_mem: u64,
}

/// Everything before the first event.
#[derive(Clone, Copy, Debug)]
pub struct Header<'a> {
    pub base_time_ns: u128,
    pub distributed: &'a DistributedInfo,
    pub devices: &'a [DeviceEntry],
    pub metadata: &'a serde_json::Map<String, serde_json::Value>,
}

impl Header<'_> {
    /// The file's text up to and including the `[` of `traceEvents` and a newline: one
    /// top-level key per line.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        Ok(format!(
            "{{\"{}\":1,\"{}\":\"ns\",\"{}\":{},\n\"{}\":{},\n\"{}\":{},\n\"{}\":{},\n\"{}\":[\n",
            top::SCHEMA_VERSION,
            top::DISPLAY_TIME_UNIT,
            top::BASE_TIME_NS,
            self.base_time_ns,
            top::DISTRIBUTED_INFO,
            serde_json::to_string(self.distributed)?,
            top::DEVICE_PROPERTIES,
            serde_json::to_string(self.devices)?,
            top::METADATA,
            serde_json::to_string(self.metadata)?,
            top::TRACE_EVENTS,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_footer_make_a_valid_empty_trace() {
        let mut metadata = serde_json::Map::new();
        metadata.insert(meta::PRODUCER.into(), "test".into());
        let devices = [DeviceEntry {
            id: 0,
            name: "Mock \"GPU\"".into(),
            total_global_mem: 80 << 30,
        }];
        let h = Header {
            base_time_ns: 1_764_750_000_123_456_789,
            distributed: &DistributedInfo::default(),
            devices: &devices,
            metadata: &metadata,
        };
        let text = h.to_json().unwrap() + FOOTER;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schemaVersion"], 1);
        assert_eq!(v["displayTimeUnit"], "ns");
        assert_eq!(
            v["baseTimeNanoseconds"].as_u64(),
            Some(1_764_750_000_123_456_789)
        );
        assert_eq!(v["distributedInfo"]["rank"], 0);
        assert_eq!(v["distributedInfo"]["world_size"], 1);
        assert_eq!(
            v["deviceProperties"][0]["totalGlobalMem"].as_u64(),
            Some(80 << 30)
        );
        assert_eq!(v["deviceProperties"][0]["name"], "Mock \"GPU\"");
        assert_eq!(v["metadata"]["producer"], "test");
        assert_eq!(v["traceEvents"].as_array().map(Vec::len), Some(0));
        assert!(text.ends_with("\"traceEvents\":[\n\n]}\n"), "{text}");
    }
}
