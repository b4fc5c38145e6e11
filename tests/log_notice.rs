//! Issue 39: the line the examples' log writes after dropping lines (a
//! stderr nobody read), in the log's two formats.
#[path = "../cli/src/logging.rs"]
mod logging;

#[test]
fn the_dropped_notice_in_text_and_json() {
    let text = logging::dropped_notice("relay", false);
    assert_eq!(
        text(1),
        "relay: 1 log line dropped: the output (stderr) was not taking them\n"
    );
    assert!(text(4276).starts_with("relay: 4276 log lines dropped: "));
    let json = logging::dropped_notice("relay", true)(12);
    assert!(
        json.ends_with('\n') && json.matches('\n').count() == 1,
        "{json:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["level"], "WARN");
    assert_eq!(v["dropped"], 12);
    assert!(v["message"]
        .as_str()
        .unwrap()
        .starts_with("12 log lines dropped"));
}
