//! The CSI driver the attacher talks to: a socket the user names, or a built-in csi-mock.

use std::path::Path;
use std::time::Duration;

use csi_mock::{MockConfig, MockDriver};
use csi_spec::v1::GetPluginInfoRequest;
use csi_spec::v1::identity_client::IdentityClient;

use crate::Error;

/// How long GetPluginInfo may take.
const INFO_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Driver {
    pub(crate) endpoint: String,
    pub(crate) name: String,
    /// Set when the run started its own mock; stopped when dropped.
    pub(crate) mock: Option<MockDriver>,
}

pub(crate) async fn prepare(
    csi_address: Option<&str>,
    driver_name: Option<&str>,
    mock_delay: Duration,
    dir: &Path,
) -> Result<Driver, Error> {
    let (endpoint, mock) = match csi_address {
        Some(addr) => (addr.to_owned(), None),
        None => {
            let mut config = MockConfig {
                delay: mock_delay,
                ..MockConfig::default()
            };
            if let Some(name) = driver_name {
                config.name = name.to_owned();
            }
            let mock = csi_mock::start(dir, config).await?;
            (mock.endpoint(), Some(mock))
        }
    };
    let name = match driver_name {
        Some(n) => n.to_owned(),
        None => plugin_name(&endpoint).await?,
    };
    Ok(Driver {
        endpoint,
        name,
        mock,
    })
}

/// GetPluginInfo's name.
async fn plugin_name(endpoint: &str) -> Result<String, Error> {
    let err = |reason: String| Error::Csi {
        op: format!("CSI driver at {endpoint}"),
        reason,
    };
    let channel = csi_spec::connect_unix(endpoint)
        .await
        .map_err(|e| err(format!("cannot connect: {e}")))?;
    let mut request = tonic::Request::new(GetPluginInfoRequest {});
    request.set_timeout(INFO_TIMEOUT);
    let info = IdentityClient::new(channel)
        .get_plugin_info(request)
        .await
        .map_err(|s| err(format!("GetPluginInfo failed: {s}")))?
        .into_inner();
    if info.name.is_empty() {
        return Err(err(
            "GetPluginInfo answered an empty name (pass --driver-name)".into(),
        ));
    }
    Ok(info.name)
}
