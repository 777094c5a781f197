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
    // And given anyway, as a flag or as a variable, both refuse and write nothing.
    for (flag, var) in [
        (Some(["--config", "/x"]), None),
        (None, Some(("GATEWAY_HOME", "/x"))),
    ] {
        let mut c = gateway(home.path());
        c.env_remove("GATEWAY_HOME").env("HOME", home.path());
        if let Some(f) = flag {
            c.args(f);
        }
        if let Some((k, v)) = var {
            c.env(k, v);
        }
        let out = c
            .args(["client", "install", "claude-code"])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{flag:?} {var:?}");
        assert!(stderr(&out).contains("takes no --policies, --home or --config"));
        assert!(!home.path().join(".claude.json").exists());
        let mut c = gateway(home.path());
        c.env_remove("GATEWAY_HOME");
        if let Some(f) = flag {
            c.args(f);
        }
        if let Some((k, v)) = var {
            c.env(k, v);
        }
        let out = c.arg("serve").output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{flag:?} {var:?}");
        assert!(
            stderr(&out).contains("gateway serve takes no --policies, --home or --config"),
            "{}",
            stderr(&out)
        );
    }
}
