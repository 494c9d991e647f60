//! Reading and writing Hugging Face-style checkpoint directories: `config.json` plus
//! `model.safetensors` or a sharded `model.safetensors.index.json`, weights in bf16, fp16
//! or fp32. The tensor headers (names, shapes, dtypes) can be read without the data
//! ([`read_headers`]), to check a checkpoint before loading it. Writes are atomic: a
//! directory is built under a temporary name and renamed.
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, TensorView};
use safetensors::SafeTensors;
use tch::{Kind, Tensor};

use super::error::ModelError;

/// The name -> file map of `model.safetensors.index.json`, file names relative to `dir`.
fn read_index(index: &Path) -> Result<BTreeMap<String, String>, ModelError> {
    let text = fs::read_to_string(index).map_err(|e| ModelError::io(index, e))?;
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let idx: Index = serde_json::from_str(&text)
        .map_err(|e| ModelError::Checkpoint(format!("{}: {e}", index.display())))?;
    Ok(idx.weight_map)
}

/// Lists the safetensors files of a checkpoint directory: `model.safetensors`, or the
/// files a sharded checkpoint's index names.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let mut files: Vec<PathBuf> = read_index(&index)?.values().map(|f| dir.join(f)).collect();
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

/// One tensor as a safetensors header describes it.
#[derive(Debug, Clone)]
pub struct TensorHeader {
    /// The file that holds it.
    pub file: PathBuf,
    pub dtype: Dtype,
    pub shape: Vec<i64>,
}

/// The tensor headers of a checkpoint directory.
#[derive(Debug)]
pub struct Headers {
    pub tensors: BTreeMap<String, TensorHeader>,
    /// The index of a sharded checkpoint, with its name -> file map.
    pub index: Option<(PathBuf, BTreeMap<String, PathBuf>)>,
    /// The single `model.safetensors` of an unsharded one.
    pub single: Option<PathBuf>,
}

impl Headers {
    /// The file to name when `name` is missing: the shard the index puts it in, else the
    /// index, else `model.safetensors`.
    pub fn where_missing(&self, name: &str) -> PathBuf {
        match (&self.index, &self.single) {
            (Some((index, map)), _) => map.get(name).unwrap_or(index).clone(),
            (None, Some(single)) => single.clone(),
            (None, None) => PathBuf::new(),
        }
    }
}

/// Reads the header of every safetensors file of a checkpoint directory (see
/// [`weight_files`]) without reading tensor data. A file whose length does not match its
/// header (truncated, or not safetensors), a tensor in two files, or a tensor the index
/// puts in a file that does not hold it is an error naming the file.
pub fn read_headers(dir: &Path) -> Result<Headers, ModelError> {
    let index_path = dir.join("model.safetensors.index.json");
    let index = if index_path.exists() {
        let map = read_index(&index_path)?
            .into_iter()
            .map(|(k, f)| (k, dir.join(f)))
            .collect::<BTreeMap<_, _>>();
        Some((index_path, map))
    } else {
        None
    };
    let files = weight_files(dir)?;
    let single = index.is_none().then(|| files[0].clone());
    let mut tensors: BTreeMap<String, TensorHeader> = BTreeMap::new();
    for file in &files {
        for (name, dtype, shape) in read_header(file)? {
            let h = TensorHeader {
                file: file.clone(),
                dtype,
                shape,
            };
            if let Some(first) = tensors.insert(name.clone(), h) {
                return Err(ModelError::Checkpoint(format!(
                    "{}: tensor `{name}` is also in {}",
                    file.display(),
                    first.file.display()
                )));
            }
        }
    }
    if let Some((_, map)) = &index {
        for (name, file) in map {
            if tensors.get(name).map(|h| &h.file) != Some(file) {
                return Err(ModelError::Checkpoint(format!(
                    "{}: tensor `{name}` is missing (model.safetensors.index.json puts it in this file)",
                    file.display()
                )));
            }
        }
    }
    Ok(Headers {
        tensors,
        index,
        single,
    })
}

/// `(name, dtype, shape)` of every tensor of one safetensors file, from its header only.
fn read_header(file: &Path) -> Result<Vec<(String, Dtype, Vec<i64>)>, ModelError> {
    // the same limit as the safetensors reader
    const MAX_HEADER: u64 = 100_000_000;
    let bad = |m: String| ModelError::Checkpoint(format!("{}: {m}", file.display()));
    let mut f = fs::File::open(file).map_err(|e| ModelError::io(file, e))?;
    let len = f.metadata().map_err(|e| ModelError::io(file, e))?.len();
    let mut n = [0u8; 8];
    if len < 8 {
        return Err(bad(format!(
            "{len} bytes is too short for a safetensors file"
        )));
    }
    f.read_exact(&mut n).map_err(|e| ModelError::io(file, e))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || n > len - 8 {
        return Err(bad(format!(
            "header length {n} does not fit a file of {len} bytes: not a safetensors file, or truncated"
        )));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text)
        .map_err(|e| ModelError::io(file, e))?;
    let meta: Metadata =
        serde_json::from_slice(&text).map_err(|e| bad(format!("bad safetensors header: {e}")))?;
    let mut end = 0u64;
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let numel = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let bytes = numel.and_then(|n| n.checked_mul(info.dtype.size()));
        let (s, e) = info.data_offsets;
        if bytes != Some(e.wrapping_sub(s)) || e < s {
            return Err(bad(format!(
                "tensor `{name}`: data offsets {s}..{e} do not fit shape {:?} of {:?}",
                info.shape, info.dtype
            )));
        }
        end = end.max(e as u64);
        out.push((
            name,
            info.dtype,
            info.shape.iter().map(|&d| d as i64).collect(),
        ));
    }
    if 8 + n + end != len {
        return Err(bad(format!(
            "the header describes {} bytes but the file has {len}: truncated or corrupt",
            8 + n + end
        )));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Refuses a tensor stored in a dtype the loader does not read.
pub fn check_dtype(name: &str, h: &TensorHeader) -> Result<(), ModelError> {
    kind_of(h.dtype, name).map(|_| ()).map_err(|e| match e {
        ModelError::Checkpoint(m) => ModelError::Checkpoint(format!("{}: {m}", h.file.display())),
        e => e,
    })
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
