use clap::Parser;
use migration_apiserver::cli::{self, Cli, Command};

fn main() -> std::process::ExitCode {
    let args = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match args.command {
            Command::Serve(a) => {
                cli::init_logging(a.log_format);
                cli::serve(*a).await
            }
            Command::Certs(a) => cli::certs(a),
            Command::Manifests(a) => cli::manifests(a),
            Command::Crds(a) => cli::crds(a),
            Command::Roles(a) => cli::roles(a),
            Command::Storage(c) => cli::storage(c).await,
            Command::Migrate(a) => cli::migrate(a).await,
            Command::Translate(a) => cli::translate(a),
            Command::DeployCheck(a) => cli::deploy_check(a).await,
            Command::KmsTestPlugin(a) => cli::kms_test_plugin(a).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
