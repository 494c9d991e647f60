//! Out of device memory during a step: libtorch's error (returned, or raised as a panic by
//! tch's unchecked calls) becomes a one-line usage error naming the step.
use super::error::TrainError;

/// Runs one step, turning libtorch's out-of-memory error (returned, or raised as a panic
/// by tch's unchecked calls) into a one-line usage error; other panics go on unwinding.
pub(super) fn guard_oom<T>(
    step: i64,
    f: impl FnOnce() -> Result<T, crate::model::ModelError>,
) -> Result<T, TrainError> {
    let oom = |text: &str| {
        text.contains("out of memory")
            .then(|| TrainError::OutOfMemory {
                step,
                message: oom_line(text),
            })
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(oom(&e.to_string()).unwrap_or(TrainError::Step(e))),
        Err(payload) => {
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            match oom(&text) {
                Some(e) => Err(e),
                None => std::panic::resume_unwind(payload),
            }
        }
    }
}

/// The first sentence of libtorch's out-of-memory message ("CUDA out of memory. Tried to
/// allocate 246.00 MiB").
pub(crate) fn oom_line(text: &str) -> String {
    let start = text
        .find("out of memory")
        .map_or(0, |i| text[..i].rfind(['"', '(']).map_or(0, |j| j + 1));
    let rest = &text[start..];
    let end = rest.match_indices(". ").nth(1).map_or(
        rest.find('\n').unwrap_or(rest.len()).min(rest.len()),
        |(i, _)| i,
    );
    rest[..end].trim().to_string()
}

#[cfg(test)]
mod oom_tests {
    use super::*;

    #[test]
    fn an_out_of_memory_panic_becomes_a_one_line_usage_error() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let msg = "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. \
                   Tried to allocate 246.00 MiB. GPU 0 has a total capacity of 79.18 GiB\nException\")";
        let r: Result<(), _> = guard_oom(7, || panic!("{msg}"));
        let other = std::panic::catch_unwind(|| guard_oom::<()>(1, || panic!("something else")));
        std::panic::set_hook(hook);
        let e = r.unwrap_err();
        assert!(e.is_usage());
        let line = e.to_string();
        assert!(
            line.starts_with(
                "out of device memory at step 7: CUDA out of memory. Tried to allocate 246.00 MiB;"
            ),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        assert!(other.is_err(), "other panics keep unwinding");
    }
}
