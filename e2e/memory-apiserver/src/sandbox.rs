//! The sandbox: the API server plus named components running together until Ctrl-C. The
//! product demo built on it (the operator, the baremetal provider, simulated Nodes, the emulated
//! kubelet) lives in the `e2e` crate (`e2e::demo`, `cargo run -p e2e --bin sandbox`).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use tokio::task::JoinHandle;
use tracing::{error, info};

use crate::error::Error;
use crate::local::{TestApiServer, TestApiServerBuilder};

type ComponentFuture = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;
type ComponentFn = Box<dyn FnOnce(SandboxContext) -> ComponentFuture + Send>;

/// What a sandbox component gets: a client and where the kubeconfig is.
#[derive(Clone)]
pub struct SandboxContext {
    /// A client for the sandbox API server.
    pub client: kube::Client,
    /// The kubeconfig file (for child processes).
    pub kubeconfig_path: PathBuf,
    /// The server URL.
    pub url: String,
}

/// Builds a [`Sandbox`].
#[derive(Default)]
pub struct SandboxBuilder {
    server: TestApiServerBuilder,
    crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    components: Vec<(String, ComponentFn)>,
}

impl SandboxBuilder {
    /// Listen on this port (0 picks a free one).
    pub fn port(mut self, port: u16) -> Self {
        self.server = self.server.port(port);
        self
    }

    /// Write the kubeconfig here.
    pub fn kubeconfig_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.server = self.server.kubeconfig_path(path);
        self
    }

    /// Adjusts any other server option.
    pub fn server(mut self, f: impl FnOnce(TestApiServerBuilder) -> TestApiServerBuilder) -> Self {
        self.server = f(self.server);
        self
    }

    /// Installs this CRD before components start.
    pub fn crd(
        mut self,
        crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) -> Self {
        self.crds.push(crd);
        self
    }

    /// Adds a component: an async task started after the server and CRDs are up. A component
    /// that returns an error stops the sandbox.
    pub fn component<F, Fut>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: FnOnce(SandboxContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), Error>> + Send + 'static,
    {
        self.components.push((name.into(), Box::new(move |ctx| Box::pin(f(ctx)))));
        self
    }

    /// Starts the server, installs the CRDs and starts the components.
    pub async fn start(self) -> Result<Sandbox, Error> {
        let server = self.server.start().await?;
        for crd in &self.crds {
            server.install_crd(crd).await?;
        }
        let ctx = SandboxContext {
            client: server.client(),
            kubeconfig_path: server.kubeconfig_path().to_path_buf(),
            url: server.url().to_string(),
        };
        let mut components = vec![];
        for (name, f) in self.components {
            info!(component = %name, "starting sandbox component");
            components.push((name, tokio::spawn(f(ctx.clone()))));
        }
        Ok(Sandbox { server, components })
    }
}

/// A running sandbox.
pub struct Sandbox {
    server: TestApiServer,
    components: Vec<(String, JoinHandle<Result<(), Error>>)>,
}

impl Sandbox {
    /// Starts building a sandbox.
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder::default()
    }

    /// The API server.
    pub fn server(&self) -> &TestApiServer {
        &self.server
    }

    /// How to use the sandbox from a shell.
    pub fn usage(&self) -> String {
        let kc = self.server.kubeconfig_path().display();
        format!(
            "Sandbox API server listening on {url}\n\
             Kubeconfig: {kc}\n\n\
             Use it with kubectl:\n\
             \x20 export KUBECONFIG={kc}\n\
             \x20 kubectl get namespaces\n\
             \x20 kubectl apply --server-side -f charts/ccm-operator/examples/\n\
             \x20 kubectl get cloudcontrollermanagers -A\n\n\
             Test endpoints: {url}/_test/stats, {url}/_test/requests, {url}/_test/faults\n\
             Press Ctrl-C to stop.",
            url = self.server.url(),
        )
    }

    /// Runs until Ctrl-C or until a component fails.
    pub async fn run_until_ctrl_c(mut self) -> Result<(), Error> {
        let result = loop {
            let failed = self.components.iter().position(|(_, h)| h.is_finished());
            if let Some(i) = failed {
                let (name, handle) = self.components.remove(i);
                match handle.await {
                    Ok(Ok(())) => {
                        info!(component = %name, "sandbox component finished");
                        continue;
                    }
                    Ok(Err(e)) => break Err(Error::Component { name, message: e.to_string() }),
                    Err(e) => break Err(Error::Component { name, message: e.to_string() }),
                }
            }
            tokio::select! {
                r = tokio::signal::ctrl_c() => break r.map_err(Error::Io),
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
            }
        };
        if let Err(e) = &result {
            error!(error = %e, "sandbox stopping");
        }
        self.shutdown().await;
        result
    }

    /// Stops the components and the server.
    pub async fn shutdown(self) {
        for (_, h) in &self.components {
            h.abort();
        }
        self.server.shutdown().await;
    }
}
