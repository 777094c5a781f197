//! What each command's help offers is what it takes.

mod common;

use common::{gateway, stderr, stdout};

#[test]
fn serve_and_client_install_offer_no_option_they_refuse() {
    let home = tempfile::tempdir().expect("home");
    for args in [
        &["serve", "--help"][..],
        &["client", "install", "--help"][..],
    ] {
        let out = gateway(home.path()).args(args).output().expect("run");
        assert!(out.status.success(), "{}", stderr(&out));
        let help = stdout(&out);
        for flag in ["--policies", "--home", "--config"] {
            assert!(!help.contains(flag), "{args:?} offers {flag}:\n{help}");
        }
    }
    // A command that takes them still shows them.
    let out = gateway(home.path())
        .args(["policy", "test", "--help"])
        .output()
        .expect("run");
    assert!(stdout(&out).contains("--policies"));
    // And given anyway, both refuse and write nothing.
    let out = gateway(home.path())
        .env("HOME", home.path())
        .args(["client", "install", "--config", "/x", "claude-code"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("takes no --policies, --home or --config"));
    assert!(!home.path().join(".claude.json").exists());
    let out = gateway(home.path())
        .args(["serve", "--home", "/x"])
        .output()
        .expect("run");
    assert!(stderr(&out).contains("gateway serve takes no --policies, --home or --config"));
}
