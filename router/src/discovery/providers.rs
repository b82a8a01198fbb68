//! InferenceProviders and GatewayBackends for the overflow registry, from the API server (two
//! reflectors) or from the static discovery file.
//!
//! ```text
//! watcher(InferenceProvider) --reflector--> Store --+--(any event, once both listed)-->
//! watcher(GatewayBackend) ----reflector--> Store --+      Providers::apply(providers, backends)
//! static file --parse_documents--> Provider, GatewayBackend docs --> Providers::apply
//! ```
//!
//! The router only reads these objects (its RBAC has get/list/watch on them) and never
//! Secrets: credentials come from `--secrets-dir`.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kvroute_crds::{AnyResource, GatewayBackend, InferenceProvider, parse_documents};
use tokio_util::sync::CancellationToken;

use crate::provider::Providers;

/// The Provider, Backend and Secret documents of a static discovery file's text.
pub fn from_text(
    text: &str,
) -> anyhow::Result<(Vec<InferenceProvider>, Vec<GatewayBackend>, Vec<Secret>)> {
    let (mut providers, mut backends, mut secrets) = (Vec::new(), Vec::new(), Vec::new());
    for doc in parse_documents(text)? {
        match doc {
            AnyResource::Provider(p) => providers.push(p),
            AnyResource::GatewayBackend(b) => backends.push(b),
            AnyResource::Secret(s) => secrets.push(s),
            _ => {}
        }
    }
    Ok((providers, backends, secrets))
}

/// Applies a static discovery file's text to `providers` (its Secret documents stand in for
/// Secrets not mounted under `--secrets-dir`).
pub fn apply_text(providers: &Providers, text: &str) -> anyhow::Result<()> {
    let (p, b, s) = from_text(text)?;
    providers.set_inline_secrets(&s);
    providers.apply(p, b);
    Ok(())
}

/// Watches InferenceProviders and GatewayBackends (in `namespace`, or all) until `shutdown`,
/// applying every change to `providers`. Watch errors are retried with backoff.
pub async fn watch(
    client: Client,
    namespace: Option<String>,
    providers: Providers,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (provider_api, backend_api): (Api<InferenceProvider>, Api<GatewayBackend>) =
        match &namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client, ns),
            ),
            None => (Api::all(client.clone()), Api::all(client)),
        };
    let (p_store, p_writer) = reflector::store::<InferenceProvider>();
    let (b_store, b_writer) = reflector::store::<GatewayBackend>();
    let s1 = reflector::reflector(p_writer, watcher(provider_api, watcher::Config::default()))
        .default_backoff()
        .map_ok(|_| ())
        .boxed();
    let s2 = reflector::reflector(b_writer, watcher(backend_api, watcher::Config::default()))
        .default_backoff()
        .map_ok(|_| ())
        .boxed();
    let mut events = futures::stream::select_all([s1, s2]);
    loop {
        let ev = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            ev = events.next() => ev,
        };
        match ev {
            None => anyhow::bail!("provider watch streams ended"),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "provider watch error; retrying");
                continue;
            }
            Some(Ok(())) => {}
        }
        let synced = futures::future::join(p_store.wait_until_ready(), b_store.wait_until_ready());
        if futures::FutureExt::now_or_never(synced).is_some() {
            publish(&providers, &p_store, &b_store);
        }
    }
}

fn publish(providers: &Providers, p: &Store<InferenceProvider>, b: &Store<GatewayBackend>) {
    let ps: Vec<InferenceProvider> = p
        .state()
        .iter()
        .map(|x| InferenceProvider::clone(x))
        .collect();
    let bs: Vec<GatewayBackend> = b.state().iter().map(|x| GatewayBackend::clone(x)).collect();
    providers.apply(ps, bs);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_file_documents() {
        let text = "apiVersion: kvroute.dev/v1alpha1\nkind: InferenceProvider\nmetadata: {name: p}\nspec: {kind: openai, models: [m], gatewayBackendRef: {name: b}}\n---\napiVersion: kvroute.dev/v1alpha1\nkind: GatewayBackend\nmetadata: {name: b}\nspec: {url: 'https://x.example'}\n---\napiVersion: kvroute.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: pool}\nspec: {targets: [{workerSet: w}]}\n";
        let (p, b, s) = from_text(text).expect("parse");
        assert_eq!((p.len(), b.len(), s.len()), (1, 1, 0));
        assert!(from_text("kind: Nope\napiVersion: v9\n").is_err());
    }
}
