//! Reading and writing Hugging Face-style checkpoint directories: `config.json` plus
//! `model.safetensors` or a sharded `model.safetensors.index.json`, weights in bf16, fp16
//! or fp32. Writes are atomic: a directory is built under a temporary name and renamed.
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use tch::{Kind, Tensor};

use super::ModelError;

/// Lists the safetensors files of a checkpoint directory, with the key -> file map of a
/// sharded checkpoint when there is an index.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: BTreeMap<String, String>,
        }
        let idx: Index = serde_json::from_str(&text)
            .map_err(|e| ModelError::Checkpoint(format!("{}: {e}", index.display())))?;
        let mut files: Vec<PathBuf> = idx.weight_map.values().map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        Ok(files)
    } else if single.exists() {
        Ok(vec![single])
    } else {
        Err(ModelError::Checkpoint(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )))
    }
}

fn kind_of(dtype: Dtype, key: &str) -> Result<Kind, ModelError> {
    match dtype {
        Dtype::BF16 => Ok(Kind::BFloat16),
        Dtype::F16 => Ok(Kind::Half),
        Dtype::F32 => Ok(Kind::Float),
        other => Err(ModelError::Checkpoint(format!(
            "tensor `{key}` has dtype {other:?}; only BF16, F16 and F32 are supported"
        ))),
    }
}

fn dtype_of(kind: Kind) -> Dtype {
    match kind {
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        _ => Dtype::F32,
    }
}

/// Copies every variable of `vars` from the checkpoint's safetensors files. Each variable
/// must be present with exactly its shape; its dtype is converted to the variable's.
pub fn load_into(vars: &HashMap<String, Tensor>, dir: &Path) -> Result<(), ModelError> {
    let mut remaining: BTreeMap<&str, &Tensor> =
        vars.iter().map(|(k, v)| (k.as_str(), v)).collect();
    for file in weight_files(dir)? {
        with_safetensors(&file, |st| {
            for (key, view) in st.tensors() {
                let Some(var) = remaining.remove(key.as_str()) else {
                    continue;
                };
                let src = tensor_of(&key, &view)?;
                if src.size() != var.size() {
                    return Err(ModelError::Checkpoint(format!(
                        "tensor `{key}` in {} has shape {:?}, the model expects {:?}",
                        file.display(),
                        src.size(),
                        var.size()
                    )));
                }
                tch::no_grad(|| var.shallow_clone().f_copy_(&src))?;
            }
            Ok(())
        })?;
    }
    if let Some((key, _)) = remaining.into_iter().next() {
        return Err(ModelError::Checkpoint(format!(
            "tensor `{key}` is missing from the checkpoint in {}",
            dir.display()
        )));
    }
    Ok(())
}

/// Every tensor of one safetensors file, on the host, in its stored dtype.
pub fn read_tensors(file: &Path) -> Result<HashMap<String, Tensor>, ModelError> {
    with_safetensors(file, |st| {
        st.tensors()
            .into_iter()
            .map(|(key, view)| Ok((key.clone(), tensor_of(&key, &view)?)))
            .collect()
    })
}

fn with_safetensors<T>(
    file: &Path,
    f: impl FnOnce(&SafeTensors) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let bytes = fs::read(file).map_err(|e| ModelError::io(file, e))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| ModelError::Checkpoint(format!("{}: {e}", file.display())))?;
    f(&st)
}

fn tensor_of(key: &str, view: &TensorView) -> Result<Tensor, ModelError> {
    let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
    Ok(Tensor::f_from_data_size(
        view.data(),
        &shape,
        kind_of(view.dtype(), key)?,
    )?)
}

/// Host copy of a tensor, ready to be written.
struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn to_host(t: &Tensor) -> Result<HostTensor, ModelError> {
    let kind = match t.kind() {
        k @ (Kind::BFloat16 | Kind::Half | Kind::Float) => k,
        _ => Kind::Float,
    };
    let t = t
        .f_to_kind(kind)?
        .f_to_device(tch::Device::Cpu)?
        .f_contiguous()?;
    let numel = t.numel();
    let mut data = vec![0u8; numel * kind.elt_size_in_bytes()];
    t.f_copy_data_u8(&mut data, numel)?;
    Ok(HostTensor {
        dtype: dtype_of(kind),
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data,
    })
}

/// Writes `tensors` as one safetensors file at `path`.
pub fn write_safetensors(tensors: &[(String, Tensor)], path: &Path) -> Result<(), ModelError> {
    let host: Vec<(String, HostTensor)> = tensors
        .iter()
        .map(|(k, t)| Ok((k.clone(), to_host(t)?)))
        .collect::<Result<_, ModelError>>()?;
    let views: Vec<(String, TensorView)> = host
        .iter()
        .map(|(k, h)| {
            let view = TensorView::new(h.dtype, h.shape.clone(), &h.data)
                .map_err(|e| ModelError::Checkpoint(format!("tensor `{k}`: {e}")))?;
            Ok((k.clone(), view))
        })
        .collect::<Result<_, ModelError>>()?;
    safetensors::serialize_to_file(views, &None, path).map_err(|e| match e {
        safetensors::SafeTensorError::IoError(e) => ModelError::io(path, e),
        e => ModelError::Checkpoint(format!("{}: {e}", path.display())),
    })
}

/// Builds a directory under a temporary sibling name with `fill`, syncs it and moves it
/// over `dir` (see [`crate::durable::write_dir`]): a crash leaves either the old directory
/// or the new one, never half of one.
pub fn write_dir_atomically(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    crate::durable::write_dir(dir, fill, ModelError::io)
}

/// Reads and parses `dir/config.json` into `T`.
pub fn read_config<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T, ModelError> {
    let path = dir.join("config.json");
    let text = fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: serde::Serialize>(value: &T, path: &Path) -> Result<(), ModelError> {
    let text = serde_json::to_string_pretty(value).expect("config serializes");
    fs::write(path, text).map_err(|e| ModelError::io(path, e))
}
