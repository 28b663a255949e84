//! `jobhost new NAME --lang rust|python|js`: a ready-to-build handler project
//! (its source, the WIT it implements, a build script, a sample payload and
//! a README), so a first handler is one command and one build away. The
//! files are compiled into the binary, the WIT among them, so a project
//! always matches the host that wrote it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use super::fail;

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The job type's name, also the project's directory: `a-z`, `0-9`,
    /// `_`, `.` and `-`, as any job type's.
    name: String,
    /// The language to write the handler in.
    #[arg(long, value_enum, default_value = "rust")]
    lang: Language,
    /// Where to write the project [default: ./NAME]; it must not exist or be empty.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The languages a project can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Language {
    /// A cdylib crate built for wasm32-wasip2 with wit-bindgen.
    Rust,
    /// A module built with componentize-py, with jobhost's Python helpers.
    Python,
    /// An ES module built with componentize-js, with jobhost's JavaScript helpers.
    Js,
}

impl Language {
    fn name(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::Python => "Python",
            Language::Js => "JavaScript",
        }
    }

    /// The README's words for the world its build names: the Rust SDK
    /// builds against `job` (see its `http` module), the
    /// others against `job-http`, which their SDKs' HTTP helpers need.
    fn world(self) -> &'static str {
        match self {
            Language::Rust => "`job` world of `wit/job.wit`",
            Language::Python | Language::Js => {
                "`job-http` world of `wit/job-http.wit` (the `job` world of `wit/job.wit` with outbound HTTP)"
            }
        }
    }
}

const WIT: &str = include_str!("../../wit/job.wit");
/// The world with outbound HTTP, and the WASI packages it names: Python and
/// JavaScript projects build against it.
const WIT_HTTP: [(&str, &str); 8] = [
    ("wit/job-http.wit", include_str!("../../wit/job-http.wit")),
    ("wit/deps/cli.wit", include_str!("../../wit/deps/cli.wit")),
    ("wit/deps/clocks.wit", include_str!("../../wit/deps/clocks.wit")),
    ("wit/deps/filesystem.wit", include_str!("../../wit/deps/filesystem.wit")),
    ("wit/deps/http.wit", include_str!("../../wit/deps/http.wit")),
    ("wit/deps/io.wit", include_str!("../../wit/deps/io.wit")),
    ("wit/deps/random.wit", include_str!("../../wit/deps/random.wit")),
    ("wit/deps/sockets.wit", include_str!("../../wit/deps/sockets.wit")),
];
const README: &str = include_str!("templates/README.md.tmpl");
const RUST_CARGO: &str = include_str!("templates/rust/Cargo.toml.tmpl");
const RUST_LIB: &str = include_str!("templates/rust/lib.rs.tmpl");
const RUST_BUILD: &str = include_str!("templates/rust/build.sh.tmpl");
/// The Rust SDK the repository's own handlers use, written into the
/// project beside it (as the Python and JavaScript ones are).
const RUST_SDK_CARGO: &str = include_str!("templates/rust/sdk.Cargo.toml.tmpl");
const RUST_SDK_LIB: &str = include_str!("../../guests/sdk/src/lib.rs");
const RUST_SDK_HTTP: &str = include_str!("../../guests/sdk/src/http.rs");
const PYTHON_APP: &str = include_str!("templates/python/app.py.tmpl");
const PYTHON_BUILD: &str = include_str!("templates/python/build.sh.tmpl");
const PYTHON_SDK: &str = include_str!("../../guests/python/sdk/jobhost_guest/__init__.py");
const PYTHON_HTTP: &str = include_str!("../../guests/python/sdk/jobhost_guest/http.py");
const JS_APP: &str = include_str!("templates/js/app.js.tmpl");
const JS_BUILD: &str = include_str!("templates/js/build.sh.tmpl");
const JS_PACKAGE: &str = include_str!("templates/js/package.json.tmpl");
const JS_SDK: &str = include_str!("../../guests/js/sdk/jobhost_guest.js");
const PAYLOAD: &str = "{\"name\": \"Ada\"}\n";

/// The project's files, as (path, contents, executable).
fn files(name: &str, lang: Language) -> Vec<(&'static str, String, bool)> {
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &package_name(name))
            .replace("{{language}}", lang.name())
            .replace("{{world}}", lang.world())
    };
    let mut files = vec![
        ("wit/job.wit", WIT.to_string(), false),
        ("payload.json", PAYLOAD.to_string(), false),
        ("README.md", fill(README), false),
    ];
    files.extend(WIT_HTTP.iter().map(|(path, text)| (*path, text.to_string(), false)));
    match lang {
        Language::Rust => files.extend([
            ("Cargo.toml", fill(RUST_CARGO), false),
            ("src/lib.rs", fill(RUST_LIB), false),
            ("jobhost-guest/Cargo.toml", RUST_SDK_CARGO.to_string(), false),
            // The SDK reads the WIT from the repository's root there, the project's here.
            ("jobhost-guest/src/lib.rs", RUST_SDK_LIB.replace("path: \"../../wit\"", "path: \"../wit\""), false),
            ("jobhost-guest/src/http.rs", RUST_SDK_HTTP.to_string(), false),
            ("build.sh", fill(RUST_BUILD), true),
            (".gitignore", "target/\n*.wasm\n".to_string(), false),
        ]),
        Language::Python => files.extend([
            ("app.py", fill(PYTHON_APP), false),
            ("jobhost_guest/__init__.py", PYTHON_SDK.to_string(), false),
            ("jobhost_guest/http.py", PYTHON_HTTP.to_string(), false),
            ("build.sh", fill(PYTHON_BUILD), true),
            (".gitignore", "__pycache__/\n*.wasm\n".to_string(), false),
        ]),
        Language::Js => files.extend([
            ("app.js", fill(JS_APP), false),
            ("jobhost_guest.js", JS_SDK.to_string(), false),
            ("package.json", fill(JS_PACKAGE), false),
            ("build.sh", fill(JS_BUILD), true),
            (".gitignore", "node_modules/\n*.wasm\n".to_string(), false),
        ]),
    }
    files
}

/// Why a name cannot be a project's: any job type's name can, except the
/// two that name directories already (`.` and `..`).
fn check_name(name: &str) -> Result<(), String> {
    if name.chars().all(|c| c == '.') {
        return Err(format!("{name:?} cannot name a project: it names a directory that exists"));
    }
    crate::types::check_name(name).map_err(|reason| format!("cannot name a project: {reason}"))
}

/// The name of the project's package (Cargo, npm) and Rust crate, which
/// allow fewer names than job types: `.` and `-` become `_`, and a name
/// that does not start with a letter gets `job_` in front.
fn package_name(name: &str) -> String {
    let package = name.replace(['.', '-'], "_");
    if package.starts_with(|c: char| c.is_ascii_lowercase()) { package } else { format!("job_{package}") }
}

pub fn new(args: NewArgs) -> ExitCode {
    if let Err(reason) = check_name(&args.name) {
        return fail(reason);
    }
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    if std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return fail(format!("{} exists and is not empty: nothing was written", dir.display()));
    }
    for (path, contents, executable) in files(&args.name, args.lang) {
        if let Err(error) = write(&dir.join(path), &contents, executable) {
            return fail(format!("cannot write {}: {error}", dir.join(path).display()));
        }
    }
    println!("wrote {} ({}): cd {} && ./build.sh", dir.display(), args.lang.name(), dir.display());
    ExitCode::SUCCESS
}

fn write(path: &Path, contents: &str, executable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, contents)?;
    if executable {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for name in ["resize-images", "9lives", "mail.send", "_private"] {
            assert!(check_name(name).is_ok(), "{name}: a job type's name");
        }
        for name in ["Resize", "", ".", "..", "a/b"] {
            assert!(check_name(name).is_err(), "{name}");
        }
        assert_eq!(package_name("mail.send-now"), "mail_send_now");
        assert_eq!(package_name("9lives"), "job_9lives");
        assert_eq!(package_name("_private"), "job__private");
    }

    #[test]
    fn the_rust_sdk_reads_the_projects_wit_and_pins_the_guests_wit_bindgen() {
        let files = files("my-job", Language::Rust);
        let sdk = &files.iter().find(|(path, ..)| *path == "jobhost-guest/src/lib.rs").unwrap().1;
        assert!(sdk.contains("path: \"../wit\""), "the project's wit/");
        let guests = include_str!("../../guests/Cargo.toml");
        // Major and minor: the version's compatible range.
        let pinned = |text: &str| {
            let line = text.lines().find(|l| l.starts_with("wit-bindgen")).unwrap();
            let version = line.split('"').nth(1).unwrap().trim_start_matches('=');
            version.split('.').take(2).collect::<Vec<_>>().join(".")
        };
        assert_eq!(
            pinned(RUST_SDK_CARGO),
            pinned(guests),
            "the SDK written into projects builds with the repository's own wit-bindgen"
        );
    }

    #[test]
    fn every_placeholder_is_filled() {
        for lang in [Language::Rust, Language::Python, Language::Js] {
            for (path, contents, _) in files("my-job", lang) {
                assert!(!contents.contains("{{"), "{path} keeps a placeholder");
            }
        }
    }
}
