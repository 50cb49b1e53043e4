//! Where the backends of `loadbalancing` come from: a static list, DNS, or the Kubernetes
//! EndpointSlices of a Service.

pub mod dns;
pub mod k8s;
pub mod static_;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A source of backend endpoints.
#[async_trait]
pub trait Resolver: Send + Sync + 'static {
    /// Publishes the backend endpoints (`host:port`, sorted, without duplicates) on `tx` each
    /// time they change (and once when first known), until `cancel` fires. A failed lookup keeps
    /// the last list (it is logged and counted by the resolver, not published as empty).
    async fn run(self: Box<Self>, tx: watch::Sender<Vec<String>>, cancel: CancellationToken);
}
