//! Reading policy directories by OPA's bundle rules: every `.rego` module,
//! and data only from files named `data.json`, `data.yaml` or `data.yml`,
//! mounted at their directory's path (`config/tools/data.yaml` is
//! `data.config.tools`; `data.json` at the root is merged into `data`). So
//! `opa build -b`, `opa run -b` and `opa test -b` see exactly the document
//! the gateway sees.
//!
//! Any other `.json` / `.yaml` / `.yml` file is refused with the path it
//! belongs at: OPA would ignore it in a bundle (and mount it at its
//! directory, file name dropped, outside one), so a table an author means to
//! be data would silently not be. The exception is a top-level `schema/`
//! directory, which holds JSON Schemas of the input and the decision, not
//! data (a `data.json` there is data, as for OPA). A symbolic link inside a
//! policy dir is refused (OPA's loader does not follow it; the root itself
//! may be one, for atomic swaps), and so is a hidden `.rego`/data file or
//! dir (OPA would load it); `.git` and files that are not policy or data
//! (editor swap files, `x.rego~`) are ignored. A dir mounted from a
//! Kubernetes ConfigMap is read through its `..data` link: one whole
//! version of the files at a time (see [`kubelet_snapshot`]).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::PolicyError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FileKind {
    Rego,
    Json,
    Yaml,
}

/// One policy or data file, read.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The path as shown in messages (the root as given, joined with the
    /// relative path), e.g. `policies/tools.rego`.
    pub display: String,
    /// Path relative to its root, with `/` separators.
    pub relative: String,
    pub kind: FileKind,
    pub content: String,
}

/// Everything read from a set of policy roots, in a stable order.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub files: Vec<SourceFile>,
    /// For a signed bundle: the key that signed it and its revision.
    pub signed: Option<super::bundle::Verified>,
}

impl Sources {
    /// Read every policy and data file below `roots` (directories or single
    /// files).
    pub fn read(roots: &[PathBuf]) -> Result<Sources, PolicyError> {
        let mut files = Vec::new();
        for root in roots {
            let meta = std::fs::metadata(root).map_err(|source| PolicyError::Io {
                path: root.clone(),
                source,
            })?;
            if meta.is_file() {
                let name = root
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if let Some(kind) = kind_of(&name) {
                    files.push(read_file(root, &name, kind)?);
                }
                continue;
            }
            // Resolve the root once, so that a directory swapped in by
            // renaming a symlink is read wholly before or wholly after.
            let real = std::fs::canonicalize(root).map_err(|source| PolicyError::Io {
                path: root.clone(),
                source,
            })?;
            let real = kubelet_snapshot(&real)?.unwrap_or(real);
            let mut found = Vec::new();
            walk(&real, &real, &mut found)?;
            found.sort();
            for (path, rel, kind) in found {
                if kind != FileKind::Rego && rel.starts_with("schema/") && !is_data_file(&rel) {
                    continue;
                }
                if kind != FileKind::Rego && !is_data_file(&rel) {
                    return Err(PolicyError::Data {
                        path: root.join(&rel),
                        message: format!(
                            "OPA reads data only from files named data.json or data.yaml; move it to {}",
                            suggested_path(&rel)
                        ),
                    });
                }
                let mut file = read_file(&path, &rel, kind)?;
                file.display = root.join(&rel).display().to_string();
                files.push(file);
            }
        }
        let sources = Sources {
            files,
            signed: None,
        };
        sources.check_data_leaves_rules_alone()?;
        Ok(sources)
    }

    /// Refuse data that lands where a policy package is: a data file at or
    /// below a package's path, or one whose content reaches into it. OPA
    /// refuses such a set ("conflicting rule"); regorus would let the data
    /// silently replace the rules, so that a `gateway/approvals/data.json`
    /// of `{"requirement": {...}}` would waive every approval.
    fn check_data_leaves_rules_alone(&self) -> Result<(), PolicyError> {
        let packages: Vec<(Vec<String>, &str)> = self
            .files
            .iter()
            .filter(|f| f.kind == FileKind::Rego)
            .filter_map(|f| package_path(&f.content).map(|p| (p, f.display.as_str())))
            .collect();
        for f in self.files.iter().filter(|f| f.kind != FileKind::Rego) {
            let value = data_value(f)?;
            for (package, module) in &packages {
                let mut here = &value;
                let mut clash = true;
                for key in package {
                    match here {
                        regorus::Value::Object(m) => {
                            match m.get(&regorus::Value::from(key.as_str())) {
                                Some(next) => here = next,
                                None => {
                                    clash = false;
                                    break;
                                }
                            }
                        }
                        _ => break,
                    }
                }
                if clash {
                    return Err(PolicyError::Data {
                        path: PathBuf::from(&f.display),
                        message: format!(
                            "it puts data at data.{}, the package of {module}: data may not replace or shadow rules (OPA refuses this too)",
                            package.join(".")
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// SHA-256 over every file's relative path, kind and content: equal
    /// fingerprints mean the same policy set.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        for f in &self.files {
            // The relative path, not where the dir is: the same set has
            // the same fingerprint on every replica and in every copy.
            h.update(f.relative.as_bytes());
            h.update([0u8]);
            h.update(f.content.as_bytes());
            h.update([0u8]);
        }
        hex::encode(h.finalize())
    }

    /// Every policy and data file of a verified bundle, by the rules a
    /// directory is read with: `.rego` modules, data only from `data.json` /
    /// `data.yaml` / `data.yml` (mounted at their dir), a top-level
    /// `schema/` and files that are neither skipped, a hidden policy or data
    /// file refused. `label` prefixes the names shown in messages.
    pub fn from_bundle(
        label: &str,
        files: &[super::bundle::BundleFile],
    ) -> Result<Sources, PolicyError> {
        use super::bundle::{MANIFEST, SIGNATURES};
        let mut out = Vec::new();
        for f in files {
            if f.name == SIGNATURES || f.name == MANIFEST {
                continue;
            }
            let path = PathBuf::from(format!("{label}:{}", f.name));
            let base = f.name.rsplit('/').next().unwrap_or(&f.name);
            let Some(kind) = kind_of(base.trim_start_matches('.')) else {
                continue;
            };
            if f.name.split('/').any(|c| c.starts_with('.')) {
                return Err(PolicyError::Data {
                    path,
                    message: "a hidden policy or data file in the bundle (OPA would load it, the gateway does not read hidden files)".into(),
                });
            }
            if kind != FileKind::Rego && !is_data_file(&f.name) {
                if f.name.starts_with("schema/") {
                    continue;
                }
                return Err(PolicyError::Data {
                    path,
                    message: format!(
                        "OPA reads data only from files named data.json or data.yaml; move it to {}",
                        suggested_path(&f.name)
                    ),
                });
            }
            if kind == FileKind::Yaml {
                // Its digest is taken over a JSON form YAML does not map
                // onto exactly (keys that are numbers or booleans become
                // strings): what is signed must be what is loaded.
                return Err(PolicyError::Data {
                    path,
                    message: "YAML data is not accepted in a bundle: carry it as data.json (gateway policy build converts it)".into(),
                });
            }
            let content = String::from_utf8(f.bytes.clone())
                .map_err(|_| PolicyError::Encoding { path: path.clone() })?;
            out.push(SourceFile {
                display: path.display().to_string(),
                relative: f.name.clone(),
                kind,
                content,
            });
        }
        let sources = Sources {
            files: out,
            signed: None,
        };
        sources.check_data_leaves_rules_alone()?;
        Ok(sources)
    }

    pub fn rego_count(&self) -> usize {
        self.files
            .iter()
            .filter(|f| f.kind == FileKind::Rego)
            .count()
    }
}

fn kind_of(name: &str) -> Option<FileKind> {
    if name.starts_with('.') || name.ends_with('~') {
        return None;
    }
    let ext = Path::new(name).extension()?.to_str()?;
    match ext {
        "rego" => Some(FileKind::Rego),
        "json" => Some(FileKind::Json),
        "yaml" | "yml" => Some(FileKind::Yaml),
        _ => None,
    }
}

/// The name of the link the kubelet swaps when a mounted ConfigMap (or
/// Secret, or projected volume) changes.
pub const KUBELET_DATA_LINK: &str = "..data";

/// A dir the kubelet writes for a ConfigMap volume: each version of the
/// files is a dir of its own (`..2026_12_03_17_05_01.123456789`), never
/// changed once written; the `..data` link names the current one and is
/// replaced by a rename (atomically); the top-level entries are links
/// through `..data`. Reading through the resolved `..data` reads one whole
/// version, never a mixture of two, whatever the kubelet does meanwhile (a
/// version removed mid-read makes the read fail, and the next poll reads
/// the new one). Returns that version's dir when `dir` has this layout.
fn kubelet_snapshot(dir: &Path) -> Result<Option<PathBuf>, PolicyError> {
    let link = dir.join(KUBELET_DATA_LINK);
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {}
        _ => return Ok(None),
    }
    let target = std::fs::read_link(&link).map_err(|source| PolicyError::Io {
        path: link.clone(),
        source,
    })?;
    // The kubelet's link is one relative name in the same dir; anything
    // else is not its layout, and is refused rather than followed.
    let name = target.to_string_lossy();
    if target.components().count() != 1 || !name.starts_with("..") || name == ".." {
        return Err(PolicyError::Data {
            path: link,
            message: format!(
                "points at {name:?}: the kubelet's ..data link names a dir beside it (..<timestamp>); a link elsewhere is not followed"
            ),
        });
    }
    let version = dir.join(&target);
    let meta = std::fs::symlink_metadata(&version).map_err(|source| PolicyError::Io {
        path: version.clone(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(PolicyError::Data {
            path: version,
            message: "the ..data link does not name a dir".into(),
        });
    }
    Ok(Some(version))
}

fn walk(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(PathBuf, String, FileKind)>,
) -> Result<(), PolicyError> {
    let io = |source| PolicyError::Io {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|source| PolicyError::Io {
            path: path.clone(),
            source,
        })?;
        let refuse = |why: &str| PolicyError::Data {
            path: path.clone(),
            message: why.to_string(),
        };
        // OPA's bundle loader does not follow links inside a bundle; the
        // gateway refuses them rather than read something else than OPA.
        if meta.file_type().is_symlink() {
            return Err(refuse(
                "a symbolic link inside a policy dir (OPA's bundle loader does not follow it): replace it with the file or dir itself",
            ));
        }
        if meta.is_dir() {
            if name == ".git" {
                continue;
            }
            if name.starts_with('.') {
                return Err(refuse(
                    "a hidden dir inside a policy dir (OPA would load what it holds, the gateway does not read hidden paths): rename or remove it",
                ));
            }
            walk(root, &path, out)?;
        } else if name.starts_with('.') {
            let ext = Path::new(&name).extension().and_then(|e| e.to_str());
            if matches!(ext, Some("rego" | "json" | "yaml" | "yml")) {
                return Err(refuse(
                    "a hidden policy or data file (OPA would load it, the gateway does not read hidden files): rename or remove it",
                ));
            }
        } else if let Some(kind) = kind_of(&name) {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((path, rel, kind));
        }
    }
    Ok(())
}

fn read_file(path: &Path, relative: &str, kind: FileKind) -> Result<SourceFile, PolicyError> {
    let bytes = std::fs::read(path).map_err(|source| PolicyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let content = String::from_utf8(bytes).map_err(|_| PolicyError::Encoding {
        path: path.to_path_buf(),
    })?;
    Ok(SourceFile {
        display: path.display().to_string(),
        relative: relative.to_string(),
        kind,
        content,
    })
}

/// The path of a module's package (`package gateway.approvals` ->
/// [gateway, approvals]); `package a["b-c"].d` forms too.
fn package_path(rego: &str) -> Option<Vec<String>> {
    let line = rego
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("package ") || l.starts_with("package\t"))?;
    let path = line["package".len()..]
        .split('#')
        .next()
        .unwrap_or_default()
        .trim();
    let mut parts = Vec::new();
    for piece in path.split(['.', '[', ']']) {
        let piece = piece.trim().trim_matches('"');
        if !piece.is_empty() {
            parts.push(piece.to_string());
        }
    }
    (!parts.is_empty()).then_some(parts)
}

/// Whether a file's name makes it data in an OPA bundle.
fn is_data_file(relative: &str) -> bool {
    let name = relative.rsplit('/').next().unwrap_or(relative);
    matches!(name, "data.json" | "data.yaml" | "data.yml")
}

/// Where a misnamed data file belongs: `config/tools.yaml` ->
/// `config/tools/data.yaml`.
fn suggested_path(relative: &str) -> String {
    let p = Path::new(relative);
    let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned());
    let ext = p.extension().map(|s| s.to_string_lossy().into_owned());
    let dir = p
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .filter(|d| !d.is_empty());
    let ext = if ext.as_deref() == Some("json") {
        "json"
    } else {
        "yaml"
    };
    match (dir, stem) {
        (Some(d), Some(s)) => format!("{d}/{s}/data.{ext}"),
        (None, Some(s)) => format!("{s}/data.{ext}"),
        _ => format!("data.{ext}"),
    }
}

/// The `data` path a data file is mounted at: its directory (OPA's rule).
/// A data file given by itself (not inside a policy dir) is merged at the
/// root, as `opa eval -d FILE` does.
pub fn data_path(relative: &str) -> Vec<String> {
    let mut parts: Vec<String> = relative.split('/').map(str::to_string).collect();
    parts.pop();
    parts
}

/// Parse a data file into a regorus value mounted at its path.
pub fn data_value(file: &SourceFile) -> Result<regorus::Value, PolicyError> {
    let err = |message: String| PolicyError::Data {
        path: PathBuf::from(&file.display),
        message,
    };
    let mut value = match file.kind {
        FileKind::Json => {
            let v: serde_json::Value =
                serde_json::from_str(&file.content).map_err(|e| err(e.to_string()))?;
            regorus::Value::from(v)
        }
        FileKind::Yaml => {
            regorus::Value::from_yaml_str(&file.content).map_err(|e| err(e.to_string()))?
        }
        FileKind::Rego => return Err(err("not a data file".into())),
    };
    let path = data_path(&file.relative);
    if path.is_empty() && !matches!(value, regorus::Value::Object(_)) {
        return Err(err("a data file at the root must hold an object".into()));
    }
    for key in path.iter().rev() {
        let mut obj = std::collections::BTreeMap::new();
        obj.insert(regorus::Value::from(key.as_str()), value);
        value = regorus::Value::from(obj);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_files_are_keyed_by_their_directory() {
        assert_eq!(data_path("config/tools/data.yaml"), vec!["config", "tools"]);
        assert_eq!(data_path("x/data.json"), vec!["x"]);
        assert!(data_path("data.yaml").is_empty());
        assert_eq!(
            suggested_path("config/tools.yaml"),
            "config/tools/data.yaml"
        );
        assert_eq!(suggested_path("limits.json"), "limits/data.json");
    }

    #[test]
    fn a_data_file_opa_would_not_read_is_refused_with_where_it_belongs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        std::fs::create_dir_all(p.join("config")).expect("mkdir");
        std::fs::write(p.join("config/tools.yaml"), "k: v\n").expect("write");
        let err = Sources::read(&[p.to_path_buf()]).expect_err("refused");
        assert!(
            err.to_string()
                .contains("move it to config/tools/data.yaml"),
            "{err}"
        );
        // JSON Schemas under schema/ are not data.
        std::fs::remove_file(p.join("config/tools.yaml")).expect("rm");
        std::fs::create_dir_all(p.join("schema")).expect("mkdir");
        std::fs::write(p.join("schema/input.json"), "{}").expect("write");
        let s = Sources::read(&[p.to_path_buf()]).expect("read");
        assert!(s.files.is_empty());
    }

    #[test]
    fn reads_rego_and_data_and_ignores_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        std::fs::create_dir_all(p.join("config")).expect("mkdir");
        std::fs::create_dir_all(p.join(".git")).expect("mkdir");
        std::fs::write(p.join("a.rego"), "package a\nx := 1\n").expect("write");
        std::fs::create_dir_all(p.join("config/t")).expect("mkdir");
        std::fs::write(p.join("config/t/data.yaml"), "k: v\n").expect("write");
        std::fs::write(p.join(".git/x.rego"), "junk").expect("write");
        std::fs::write(p.join(".git/config"), "junk").expect("write");
        std::fs::write(p.join(".a.rego.swp"), "junk").expect("write");
        std::fs::write(p.join("a.rego~"), "junk").expect("write");
        std::fs::write(p.join("README.md"), "# hi").expect("write");
        let s = Sources::read(&[p.to_path_buf()]).expect("read");
        let rel: Vec<_> = s.files.iter().map(|f| f.relative.as_str()).collect();
        assert_eq!(rel, vec!["a.rego", "config/t/data.yaml"]);
        let before = s.fingerprint();
        std::fs::write(p.join("config/t/data.yaml"), "k: w\n").expect("write");
        assert_ne!(
            Sources::read(&[p.to_path_buf()])
                .expect("read")
                .fingerprint(),
            before
        );
    }

    #[test]
    fn data_that_would_replace_rules_is_refused() {
        for (file, content) in [
            (
                "gateway/approvals/data.json",
                r#"{"requirement": {"required": false}}"#,
            ),
            ("gateway/data.json", r#"{"decision": {"allow": true}}"#),
            ("data.json", r#"{"gateway": {"approvals": {"x": 1}}}"#),
            ("gateway/approvals/more/data.yaml", "x: 1\n"),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let p = dir.path();
            std::fs::write(
                p.join("a.rego"),
                "package gateway.approvals\nrequirement := 1\n",
            )
            .expect("write");
            std::fs::write(p.join("d.rego"), "package gateway\ndecision := 1\n").expect("write");
            let f = p.join(file);
            std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
            std::fs::write(&f, content).expect("write");
            let err = Sources::read(&[p.to_path_buf()]).expect_err(file);
            assert!(
                err.to_string().contains("may not replace or shadow rules"),
                "{file}: {err}"
            );
        }
        // Data beside the package is fine.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("a.rego"),
            "package gateway.approvals\nx := 1\n",
        )
        .expect("write");
        std::fs::create_dir_all(dir.path().join("gateway")).expect("mkdir");
        std::fs::write(dir.path().join("gateway/data.json"), r#"{"other": 1}"#).expect("write");
        std::fs::create_dir_all(dir.path().join("config")).expect("mkdir");
        std::fs::write(dir.path().join("config/data.json"), r#"{"gateway": 1}"#).expect("write");
        Sources::read(&[dir.path().to_path_buf()]).expect("data beside a package");
        assert_eq!(
            package_path("# c\npackage a[\"b-c\"].d # x\n"),
            Some(vec!["a".into(), "b-c".into(), "d".into()])
        );
    }

    #[test]
    fn links_and_hidden_policy_files_are_refused() {
        for setup in ["link-file", "link-dir", "hidden-rego", "hidden-dir"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let p = dir.path();
            std::fs::write(p.join("a.rego"), "package a\nx := 1\n").expect("write");
            match setup {
                "link-file" => std::os::unix::fs::symlink("/etc/hostname", p.join("b.rego")),
                "link-dir" => std::os::unix::fs::symlink("/etc", p.join("config")),
                "hidden-rego" => std::fs::write(p.join(".b.rego"), "package b\n"),
                _ => std::fs::create_dir_all(p.join(".hidden")),
            }
            .expect("setup");
            let err = Sources::read(&[p.to_path_buf()]).expect_err(setup);
            let m = err.to_string();
            assert!(
                m.contains("symbolic link") || m.contains("hidden"),
                "{setup}: {m}"
            );
        }
    }

    #[test]
    fn non_utf8_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.rego"), b"package a\n\xff\n").expect("write");
        let err = Sources::read(&[dir.path().to_path_buf()]).expect_err("refused");
        assert!(err.to_string().contains("not valid UTF-8"), "{err}");
    }
}
