//! Embeds the migrations: writes `$OUT_DIR/migrations.rs`, a list per
//! backend of each file's name and its text (`include_str!`), in version
//! order, which `store::migrations` turns into sqlx's migrator. (sqlx's own
//! `migrate!` macro does the same at compile time, but needs its macro
//! crate, which builds both database drivers a second time.) Cargo reruns
//! this when a file in `migrations/` changes.

use std::fmt::Write;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let mut out = String::new();
    for (constant, folder) in [("POSTGRES", "migrations/postgres"), ("SQLITE", "migrations/sqlite")] {
        let dir = Path::new(&root).join(folder);
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a directory entry").file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        files.sort();
        writeln!(out, "pub const {constant}: &[(&str, &str)] = &[").unwrap();
        for name in files {
            let path = dir.join(&name);
            writeln!(out, "    ({name:?}, include_str!({:?})),", path.display().to_string()).unwrap();
        }
        writeln!(out, "];").unwrap();
    }
    let target = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("migrations.rs");
    std::fs::write(target, out).expect("write the migrations' list");
}
