//! Compiled components cached on disk by content digest and engine
//! fingerprint, so a restart (or a second host on the machine) loads a
//! component in milliseconds instead of recompiling it.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// A folder of precompiled components. Every file is written once under a
/// temporary name and renamed into place, so a reader never sees half a file.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    fingerprint: String,
}

impl ArtifactCache {
    /// A cache in `dir` for artifacts this engine can load.
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ArtifactCache { dir, fingerprint: format!("{:016x}", hasher.finish()) }
    }

    /// The file holding the artifact of the component with this digest.
    pub fn path_for(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.fingerprint))
    }

    /// Loads a cached artifact, if one is present and this engine accepts it.
    /// A corrupt or incompatible file is removed and reported as a miss.
    pub fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path_for(digest);
        // Read into memory rather than mapping the file: another host may
        // replace it while this one runs the component.
        let bytes = std::fs::read(&path).ok()?;
        // SAFETY: the file was written by `store` from `Engine::precompile_component`
        // of an engine with the same fingerprint, in a folder owned by the host;
        // wasmtime still checks the header and engine compatibility.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(component) => Some(component),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "discarding unusable cached component");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores an artifact; failures only cost a recompile later, so they are logged.
    pub fn store(&self, digest: &str, artifact: &[u8]) {
        if let Err(error) = self.try_store(digest, artifact) {
            tracing::warn!(dir = %self.dir.display(), %error, "could not cache compiled component");
        }
    }

    fn try_store(&self, digest: &str, artifact: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path_for(digest);
        let temp = temp_path(&path);
        std::fs::write(&temp, artifact)?;
        std::fs::rename(&temp, &path)
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}
