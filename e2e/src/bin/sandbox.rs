//! The sandbox: a local Kubernetes API server (the e2e test server) with the
//! CloudControllerManager CRD installed, a kubeconfig for kubectl, running until Ctrl-C.
//!
//! ```sh
//! cargo run -p e2e --bin sandbox                 # http://127.0.0.1:8080
//! cargo run -p e2e --bin sandbox -- --port 0     # any free port
//! ```
//!
//! Later work adds the operator, a provider and simulated nodes as sandbox components
//! (`e2e_apiserver::SandboxBuilder::component`).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Parser;
use e2e_apiserver::Sandbox;
use tracing_subscriber::EnvFilter;

/// Runs a local Kubernetes API server for trying ccm-operator without a cluster.
#[derive(Debug, Parser)]
#[command(name = "sandbox")]
struct Args {
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,
    /// Where to write the kubeconfig (default: <temp dir>/ccm-operator-sandbox/kubeconfig).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Do not install the CloudControllerManager CRD.
    #[arg(long)]
    no_crds: bool,
}

#[tokio::main]
async fn main() -> Result<(), e2e_apiserver::Error> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let args = Args::parse();
    let kubeconfig =
        args.kubeconfig.unwrap_or_else(|| std::env::temp_dir().join("ccm-operator-sandbox").join("kubeconfig"));
    let address = args.address;
    let mut builder =
        Sandbox::builder().port(args.port).kubeconfig_path(kubeconfig).server(move |s| s.bind_address(address));
    if !args.no_crds {
        builder = builder.crd(crds::crd());
    }
    let sandbox = builder.start().await?;
    println!("{}", sandbox.usage());
    sandbox.run_until_ctrl_c().await
}
