//! `kvroute tenant-key new --tenant T`: a fresh random API key for a tenant, and the line to
//! put in the pool's API-key Secret (only the digest is stored; the key is shown once).
//!
//! ```text
//! 256 random bits --hex--> kvr_<64 hex>  (give to the tenant)
//!                 --sha256--> sha256:<64 hex>  (Secret data key T; add it as a second line
//!                                               while the old key is still in use)
//! ```

use anyhow::bail;

use crate::tenant::apikeys::{new_key, secret_line};
use crate::tenant::valid_tenant;

/// `kvroute tenant-key`.
#[derive(Debug, Clone, clap::Args)]
pub struct TenantKeyArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TenantKeyCommand,
}

/// `kvroute tenant-key` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TenantKeyCommand {
    /// Print a new API key and its Secret line.
    New {
        /// The tenant (a DNS label: lowercase letters, digits, `-`).
        #[arg(long, env = "KVROUTE_TENANT_KEY_TENANT")]
        tenant: String,
    },
}

/// What `tenant-key new` prints, as text lines.
pub fn new_key_text(tenant: &str) -> anyhow::Result<String> {
    if !valid_tenant(tenant) {
        bail!(
            "`{tenant}` is not a tenant name: 1-63 lowercase letters, digits or `-`, starting and ending with a letter or digit"
        );
    }
    let key = new_key();
    let line = secret_line(&key);
    Ok(format!(
        "key: {key}\nsecret line: {line}\n\n# Give the key to {tenant}; store only the digest, e.g.:\n\
         kubectl create secret generic <secret> --from-literal={tenant}={line}\n\
         # To rotate, make the value two lines (old and new digest), then drop the old one.\n"
    ))
}

/// Runs the command.
pub async fn run(args: TenantKeyArgs) -> anyhow::Result<()> {
    match args.command {
        TenantKeyCommand::New { tenant } => print!("{}", new_key_text(&tenant)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::apikeys::{KeyTable, parse_key_lines};

    #[test]
    fn printed_key_matches_its_line() {
        let text = new_key_text("team-a").expect("valid");
        let key = text
            .lines()
            .find_map(|l| l.strip_prefix("key: "))
            .expect("key line");
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("secret line: "))
            .expect("secret line");
        let mut t = KeyTable::default();
        t.insert("team-a", &parse_key_lines(line).expect("parses"));
        assert_eq!(t.lookup(key), Some("team-a"));
        assert!(new_key_text("Team A").is_err());
    }
}
