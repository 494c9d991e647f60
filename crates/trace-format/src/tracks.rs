//! The processes and threads of a dflash trace: the trainer's pid and the GPUs' pids,
//! the names of GPU processes and stream tracks, and the sort order of the processes.

/// A GPU's pid is its device index, as in Kineto; devices at or above this get no track.
pub const MAX_GPU_DEVICES: usize = 64;

/// The trainer's `pid`: the OS process id, moved above the device range when it is small
/// (PID 1 in a container) so that it cannot collide with a GPU's pid.
pub const fn trainer_pid(os_pid: u32) -> u32 {
    if (os_pid as usize) < MAX_GPU_DEVICES {
        os_pid + (1 << 20)
    } else {
        os_pid
    }
}

/// `process_sort_index` of the trainer: first.
pub const TRAINER_SORT_INDEX: u64 = 0;

/// `process_sort_index` of GPU `device`: after the trainer, by index.
pub const fn gpu_sort_index(device: u32) -> u64 {
    device as u64 + 1
}

/// `process_name` of GPU `device`.
pub fn gpu_process_name(device: u32) -> String {
    format!("GPU {device}")
}

/// `thread_name` of a stream's track: `stream <id> (<label>)`, the label being what the
/// launching thread was bound with.
pub fn stream_track_name(stream: i64, label: Option<&str>) -> String {
    match label {
        Some(l) => format!("stream {stream} ({l})"),
        None => format!("stream {stream}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pids_move_above_the_gpus() {
        assert_eq!(trainer_pid(1), 1 + (1 << 20));
        assert_eq!(trainer_pid(63), 63 + (1 << 20));
        assert_eq!(trainer_pid(64), 64);
        assert_eq!(trainer_pid(4242), 4242);
        assert_eq!(stream_track_name(7, Some("drafter")), "stream 7 (drafter)");
        assert_eq!(stream_track_name(-3, None), "stream -3");
        assert_eq!(gpu_process_name(1), "GPU 1");
        assert_eq!(gpu_sort_index(1), 2);
    }
}
