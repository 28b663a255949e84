//! The migrations a database records against those this binary carries. An
//! older binary must refuse a database a newer one migrated, saying so,
//! rather than fail on the migrator's "migration N … missing" or run on a
//! schema it does not know.

use sqlx::migrate::Migrator;

use super::{Error, Result};

/// Refuses a database that records a migration `migrator` does not carry.
///
/// # Errors
/// [`Error::SchemaTooNew`] when the database is ahead of this binary,
/// [`Error::SchemaUnknown`] when it holds a migration this binary skipped.
pub fn check_known(applied: &[i64], migrator: &Migrator) -> Result<()> {
    let carried = |version: i64| migrator.iter().any(|m| m.version == version);
    let Some(unknown) = applied.iter().copied().filter(|v| !carried(*v)).max() else {
        return Ok(());
    };
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    let database = applied.iter().copied().max().unwrap_or(unknown);
    if database > known { Err(Error::SchemaTooNew { database, known }) } else { Err(Error::SchemaUnknown(unknown)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_ahead_of_the_binary_names_both_versions() {
        let migrator = crate::store::migrations::sqlite();
        let known = migrator.iter().map(|m| m.version).max().unwrap();
        assert!(check_known(&[1, 2], migrator).is_ok());
        assert!(check_known(&[], migrator).is_ok());
        let error = check_known(&[1, 2, known + 5], migrator).unwrap_err();
        assert!(matches!(error, Error::SchemaTooNew { database, known: k } if database == known + 5 && k == known));
        assert!(error.to_string().contains("upgrade jobhost"), "{error}");
    }
}
