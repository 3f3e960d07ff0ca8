//! A full disk under `--data-dir`: writes that cannot be made durable are refused with a 500
//! (as kube-apiserver answers when etcd is out of space), not acknowledged and lost at the
//! next restart; once there is room again writes go through, and everything acknowledged is
//! there after a restart. Root only (the data dir is a small tmpfs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": {"k": "v"}
    }))
    .unwrap()
}

/// A 2 MiB tmpfs, unmounted on drop.
struct SmallFs(tempfile::TempDir);

impl Drop for SmallFs {
    fn drop(&mut self) {
        test_support::unmount_all_below(self.0.path());
    }
}

#[tokio::test]
async fn writes_that_cannot_be_made_durable_are_refused_and_the_acknowledged_ones_survive() {
    // CAP_SYS_ADMIN (21): mounting a tmpfs.
    if !test_support::has_capability(21) {
        test_support::skip_or_fail("mounting a tmpfs needs CAP_SYS_ADMIN (root)");
        return;
    }
    let fs = SmallFs(tempfile::tempdir().unwrap());
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(fs.0.path())
        .status()
        .unwrap()
        .success();
    assert!(ok, "mounting a tmpfs");
    let config = apiserver::Config {
        data_dir: Some(fs.0.path().join("data")),
        ..Default::default()
    };
    let server = apiserver::ApiServer::start(config.clone()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    cms.create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();

    // Take every free byte.
    let filler = fs.0.path().join("filler");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
    }
    // The first write after the disk filled may be acknowledged (it is queued, and kept in
    // memory until it is on disk); from the failed write on, writes are refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut acknowledged = Vec::new();
    let refused = loop {
        assert!(
            Instant::now() < deadline,
            "writes were never refused on a full disk"
        );
        let name = format!("during-{}", acknowledged.len());
        match cms.create(&PostParams::default(), &config_map(&name)).await {
            Ok(_) => acknowledged.push(name),
            Err(kube::Error::Api(e)) => break e,
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(refused.code, 500, "{refused:?}");
    assert!(
        refused.message.contains("storage is failing"),
        "{}",
        refused.message
    );
    // Reads still work.
    assert!(cms.get("before").await.is_ok());

    // Room again: within a few seconds writes are accepted.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cms
            .create(&PostParams::default(), &config_map("after"))
            .await
        {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "writes still refused: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    server.shutdown().await.unwrap();

    // Everything acknowledged is there after a restart.
    let server = apiserver::ApiServer::start(config).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for name in ["before", "after"]
        .into_iter()
        .map(String::from)
        .chain(acknowledged.iter().cloned())
    {
        assert!(
            cms.get_opt(&name).await.unwrap().is_some(),
            "{name} was acknowledged and is gone after a restart"
        );
    }
    server.shutdown().await.unwrap();
}
