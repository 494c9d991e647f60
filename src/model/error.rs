//! The error type of the model layer: model construction, checkpoint I/O and the
//! objective. Its own module so that every part of the layer, [`super::checkpoint`]
//! included, can name it without importing the layer's root.
use std::path::Path;

/// Errors of model construction, checkpoint I/O and the objective.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("bad model config: {0}")]
    Config(String),
    #[error("bad checkpoint: {0}")]
    Checkpoint(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("CUDA: {0}")]
    Cuda(#[from] crate::cuda::CudaError),
}

impl ModelError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
