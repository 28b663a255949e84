//! Sealed secrets in PostgreSQL: names, the sealing key's fingerprint,
//! nonces and ciphertexts; never a value.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::PgStore;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::SecretDriver;
use crate::store::secret::{Sealed, SecretInfo};

pub async fn set(conn: &mut PgConnection, name: &str, sealed: &Sealed) -> Result<bool> {
    let replaced: bool = sqlx::query_scalar(
        "INSERT INTO jobhost.outbound_secrets (name, key_id, nonce, ciphertext) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name) DO UPDATE
            SET key_id = EXCLUDED.key_id, nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext, updated_at = now()
         RETURNING xmax <> 0",
    )
    .bind(name)
    .bind(&sealed.key_id)
    .bind(&sealed.nonce)
    .bind(&sealed.ciphertext)
    .fetch_one(conn)
    .await?;
    Ok(replaced)
}

pub async fn delete(conn: &mut PgConnection, name: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM jobhost.outbound_secrets WHERE name = $1").bind(name).execute(conn).await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn list(pool: &PgPool) -> Result<Vec<SecretInfo>> {
    let rows: Vec<(String, String, DateTime<Utc>, DateTime<Utc>)> =
        sqlx::query_as("SELECT name, key_id, created_at, updated_at FROM jobhost.outbound_secrets ORDER BY name")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(name, key_id, created_at, updated_at)| SecretInfo { name, key_id, created_at, updated_at })
        .collect())
}

pub async fn sealed(pool: &PgPool, names: &[String]) -> Result<Vec<(String, Sealed)>> {
    let rows: Vec<(String, String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT name, key_id, nonce, ciphertext FROM jobhost.outbound_secrets WHERE name = ANY($1) ORDER BY name",
    )
    .bind(names)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(name, key_id, nonce, ciphertext)| (name, Sealed { key_id, nonce, ciphertext })).collect())
}

#[async_trait]
impl SecretDriver for PgStore {
    async fn secret_set(&self, change: &Change<'_>, name: &str, sealed: &crate::store::secret::Sealed) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| set(conn, name, sealed).await).await
    }

    async fn secret_delete(&self, change: &Change<'_>, name: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| delete(conn, name).await).await
    }

    async fn secrets_list(&self) -> Result<Vec<crate::store::secret::SecretInfo>> {
        list(&self.pool).await
    }

    async fn secrets_sealed(&self, names: &[String]) -> Result<Vec<(String, crate::store::secret::Sealed)>> {
        sealed(&self.pool, names).await
    }
}
