//! The migrations compiled into the binary (listed by `build.rs`), as the
//! migrator sqlx runs: each file `VERSION_DESCRIPTION.sql`, applied in one
//! transaction unless it starts with `-- no-transaction`, recorded with
//! the SHA-384 of its text, exactly as sqlx's `migrate!` would record it,
//! so databases migrated before keep matching.

use std::borrow::Cow;
use std::sync::OnceLock;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

mod files {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

/// The PostgreSQL migrations.
pub fn postgres() -> &'static Migrator {
    static MIGRATOR: OnceLock<Migrator> = OnceLock::new();
    MIGRATOR.get_or_init(|| migrator(files::POSTGRES))
}

/// The SQLite migrations.
pub fn sqlite() -> &'static Migrator {
    static MIGRATOR: OnceLock<Migrator> = OnceLock::new();
    MIGRATOR.get_or_init(|| migrator(files::SQLITE))
}

fn migrator(files: &'static [(&'static str, &'static str)]) -> Migrator {
    Migrator::with_migrations(files.iter().map(|(name, sql)| migration(name, sql)).collect())
}

/// One file as sqlx reads one from a directory: the version before the
/// first `_`, the rest of the name (without `.sql`) with `_` as spaces.
fn migration(name: &'static str, sql: &'static str) -> Migration {
    let (version, rest) = name.split_once('_').unwrap_or_else(|| panic!("migration {name}: no VERSION_ prefix"));
    let version: i64 = version.parse().unwrap_or_else(|_| panic!("migration {name}: the version is not a number"));
    let description = rest.trim_end_matches(".sql").replace('_', " ");
    let no_tx = sql.starts_with("-- no-transaction");
    Migration::new(
        version,
        Cow::Owned(description),
        MigrationType::Simple,
        sqlx::AssertSqlSafe(sql).into_sql_str(),
        no_tx,
    )
}

#[cfg(test)]
mod tests {
    /// Every file of each folder is a migration, numbered from 1 with no
    /// gap (a file misnamed would be skipped by a directory's reader).
    #[test]
    fn every_file_is_a_migration_in_version_order() {
        for migrator in [super::postgres(), super::sqlite()] {
            let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
            assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
            assert_eq!(versions[0], 1);
            assert_eq!(*versions.last().unwrap() as usize, versions.len(), "no gap");
        }
    }

    /// A migration's `-- functions:` header names files that exist, and
    /// only a migration after the one that made `function_sources` (0047),
    /// where they are recorded, names any.
    #[test]
    fn functions_a_migration_names_are_files_it_can_record() {
        for migration in super::postgres().iter() {
            let named = crate::store::postgres::functions::needed_by(migration.sql.as_str())
                .unwrap_or_else(|why| panic!("migration {}: {why}", migration.version));
            assert!(named.is_empty() || migration.version > 47, "migration {}", migration.version);
        }
    }
}
