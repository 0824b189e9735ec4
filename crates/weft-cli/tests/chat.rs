//! `weft chat` as a person uses it: typed into a terminal (a `tmux` pane: keys sent, the screen
//! read back), and with messages piped in. Every reply is checked against the same greedy
//! generation through the `weft` library, given the conversation as the chat saved it.
//!
//! tmux is installed with apt-get when missing (as root, or with `sudo -n`); if it cannot be,
//! the test fails and says so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use weft::{block_on, Engine, Message, Sampler};

const MODEL: &str = "smollm2-135m";

/// The greedy reply of the library to `messages`, at most `n` tokens.
fn greedy_reply(engine: &Engine, messages: &[Message], n: usize) -> String {
    greedy_reply_and_stop(engine, messages, n).0
}

/// The greedy reply of the library to `messages`, at most `n` tokens, and whether it was
/// cut at `n` tokens (rather than ended by the model).
fn greedy_reply_and_stop(engine: &Engine, messages: &[Message], n: usize) -> (String, bool) {
    let mut ctx = engine.context();
    ctx.fill_chat(messages).expect("fill_chat");
    let mut generator = ctx.generate(Sampler::Argmax).max_tokens(n);
    let mut text = String::new();
    while let Some(piece) = block_on(generator.next_text()).expect("generate") {
        text.push_str(&piece);
    }
    let cut = generator.stop_reason() == Some(&weft::StopReason::MaxTokens);
    (text, cut)
}

fn read_messages(path: &Path) -> Vec<Message> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{} was not written: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

fn roles(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(|m| m.role.as_str()).collect()
}

/// Checks that every assistant message of `messages` is the library's greedy reply to the
/// messages before it, except `interrupted` (indices), which must be a strict, non-empty start
/// of it.
fn check_replies(engine: &Engine, messages: &[Message], n: usize, interrupted: &[usize]) {
    for (i, m) in messages.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        let expected = greedy_reply(engine, &messages[..i], n);
        if interrupted.contains(&i) {
            assert!(
                !m.content.is_empty()
                    && m.content.len() < expected.len()
                    && expected.starts_with(&m.content),
                "message {i} should be a strict start of the full reply\n  kept: {:?}\n  full: {expected:?}",
                m.content
            );
        } else {
            assert_eq!(
                m.content, expected,
                "message {i} is not the library's reply"
            );
        }
    }
}

/// Notes on standard error that cannot be written (a full disk here) are dropped, not a
/// crash: a chat with `/help` and `/reset` still ends successfully, its replies printed.
#[test]
fn chat_survives_an_unwritable_standard_error() {
    let full = std::fs::File::options()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["chat", "--temp", "0", "-n", "4"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(full)
        .spawn()
        .expect("run weft");
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, b"/help\nHi\n/reset\nHi\n").expect("write");
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
}

#[test]
fn chat_reads_a_pipe_one_message_a_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str], stdin: &str| {
        let out = common::weft(args, stdin);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "weft {args:?} failed: {stderr}");
        (String::from_utf8(out.stdout).expect("utf-8"), stderr)
    };
    // What a user of llama.cpp or ollama tries first, with the default model.
    let (stdout, stderr) = run(&["chat", "--temp", "0", "-n", "16"], "Hi\nWhat is 2+2?\n");
    let engine = Engine::load(weft::hub::DEFAULT_MODEL).expect("load the default model");
    let mut messages = vec![Message::user("Hi")];
    let (first, first_cut) = greedy_reply_and_stop(&engine, &messages, 16);
    messages.push(Message::assistant(first.clone()));
    messages.push(Message::user("What is 2+2?"));
    let (second, second_cut) = greedy_reply_and_stop(&engine, &messages, 16);
    assert!(!first.is_empty() && !second.is_empty());
    assert_eq!(
        stdout,
        format!("{first}\n{second}\n"),
        "two replies, no decoration"
    );
    // A reply the model ended has no note (a cut one has: below).
    assert_eq!(
        stderr.matches("(reply cut at").count(),
        usize::from(first_cut) + usize::from(second_cut),
        "{stderr}"
    );

    // A system message, commands in the pipe, an empty line skipped.
    let f = dir.path().join("c.json");
    let script = format!("Hi\n\n/save {}\n", f.display());
    let (_, stderr) = run(
        &[
            "chat",
            "--temp",
            "0",
            "-n",
            "8",
            "--system",
            "Answer in French.",
        ],
        &script,
    );
    assert!(stderr.contains("saved 3 messages"), "{stderr}");
    let saved = read_messages(&f);
    assert_eq!(roles(&saved), ["system", "user", "assistant"]);
    assert_eq!(saved[0].content, "Answer in French.");
    check_replies(&engine, &saved, 8, &[]);
    // That reply was cut at -n: standard error says so, as at a terminal.
    assert!(
        greedy_reply_and_stop(&engine, &saved[..2], 8).1,
        "the reply was not cut"
    );
    assert!(
        stderr.contains("(reply cut at 8 tokens; -n sets the limit)"),
        "{stderr}"
    );

    // Sampling with a seed drawn from the clock: standard error names it, and --seed with
    // it gives the same replies again (greedy names none).
    let (sampled, stderr) = run(&["chat", "-n", "12"], "Tell me a story.\n");
    let seed = stderr
        .split("sampling with seed ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no seed named: {stderr}"));
    let (again, _) = run(&["chat", "-n", "12", "--seed", seed], "Tell me a story.\n");
    assert_eq!(again, sampled);
    let (_, greedy) = run(&["chat", "--temp", "0", "-n", "2"], "Hi\n");
    assert!(!greedy.contains("seed"), "{greedy}");

    // A bad command in a pipe is an error (exit status 1), not a message to the model.
    let out = common::weft(&["chat", "--temp", "0", "-n", "4"], "/load\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("usage: /load FILE"), "{stderr}");
    // A conversation with a role no template knows is refused when loaded.
    let odd = dir.path().join("odd.json");
    std::fs::write(&odd, r#"[{"role": "narrator", "content": "Once."}]"#).expect("write");
    let out = common::weft(
        &["chat", "--temp", "0", "-n", "4"],
        &format!("/load {}\n", odd.display()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown role 'narrator'"), "{stderr}");
    let out = common::weft(&["chat", "--temp", "0", "-n", "4"], "/usr/bin/env?\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown command /usr/bin/env?"), "{stderr}");
    assert!(stderr.contains("start a message with //"), "{stderr}");

    // `//` sends a message that begins with one `/`.
    let (stdout, _) = run(&["chat", "--temp", "0", "-n", "8"], "//usr/bin/env?\n");
    let reply = greedy_reply(&engine, &[Message::user("/usr/bin/env?")], 8);
    assert_eq!(stdout, format!("{reply}\n"));
}

/// `/save` over a conversation saved before: a save that dies half-way (here the file-size
/// limit kills it) leaves that file whole, and the temp file it left is removed by the next
/// save to the same file.
#[test]
fn chat_save_that_dies_keeps_the_previous_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.json");
    let save = format!("/save {}\n", f.display());
    let out = common::weft(&["chat", "--temp", "0", "-n", "2"], &format!("Hi\n{save}"));
    assert!(out.status.success(), "{out:?}");
    let before = std::fs::read(&f).expect("saved");
    assert!(
        before.len() < 512,
        "the first save is too long for the limit"
    );

    // The next message alone is longer than the 1,024 bytes the limit lets a file reach.
    let script = format!("/load {}\n{}\n{save}", f.display(), "weave ".repeat(300));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -f 1; exec "$0" chat --temp 0 -n 1"#)
        .arg(env!("CARGO_BIN_EXE_weft"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sh");
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, script.as_bytes()).expect("write");
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(!out.status.success(), "the save was not stopped: {out:?}");
    let after = std::fs::read(&f).expect("the conversation file is gone");
    assert!(
        after == before,
        "the conversation file was damaged: {}",
        String::from_utf8_lossy(&after)
    );
    let temp_files = || {
        std::fs::read_dir(dir.path())
            .expect("read_dir")
            .filter(|e| e.as_ref().is_ok_and(|e| e.file_name() != "c.json"))
            .count()
    };
    assert_eq!(
        temp_files(),
        1,
        "the killed save left no temp file to clean"
    );
    let out = common::weft(&["chat", "--temp", "0", "-n", "2"], &format!("Hi\n{save}"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(temp_files(), 0, "the temp file of a dead save was kept");
}

/// `-c/--ctx-size`: a reply that reaches the end of the context stops there (the library's
/// greedy reply with the room that was left) and says so; a message the context has no room
/// for is an error.
#[test]
fn chat_replies_end_at_the_end_of_the_context() {
    let engine = Engine::load(weft::hub::DEFAULT_MODEL).expect("load the default model");
    let messages = [Message::user("Tell me about Paris.")];
    let mut ctx = engine.context();
    ctx.fill_chat(&messages).expect("fill_chat");
    let room = 64 - ctx.pending().len();
    let args = ["chat", "--temp", "0", "-n", "200", "-c", "64"];
    let out = common::weft(&args, "Tell me about Paris.\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("reply cut at the end of the context, 64 tokens"),
        "{stderr}"
    );
    let reply = greedy_reply(&engine, &messages, room);
    assert!(greedy_reply(&engine, &messages, 200).len() > reply.len());
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{reply}\n"));

    let out = common::weft(&args, "Tell me about Paris.\nAnd Rome?\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("leaves no room in the context of 64"),
        "{stderr}"
    );
}

/// Makes sure `tmux` runs, installing it with apt-get if needed; panics saying why it cannot.
fn ensure_tmux() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        let works = || {
            Command::new("tmux")
                .arg("-V")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if works() {
            return Ok(());
        }
        eprintln!("tmux is missing: installing it with apt-get");
        let is_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let apt = |args: &[&str]| {
            let mut cmd = if is_root {
                Command::new("apt-get")
            } else {
                let mut c = Command::new("sudo");
                c.args(["-n", "apt-get"]);
                c
            };
            cmd.args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if !(apt(&["update"]) && apt(&["install", "-y", "tmux"]) && works()) {
            return Err(
                "this test drives `weft chat` through tmux, which is not installed and \
                        could not be installed (`apt-get update && apt-get install -y tmux` \
                        failed: it needs root or password-less sudo, and a Debian or Ubuntu \
                        system); install tmux and run the test again"
                    .to_string(),
            );
        }
        Ok(())
    });
    if let Err(e) = ready {
        panic!("{e}");
    }
    let bash = Command::new("bash").arg("--version").output();
    assert!(
        bash.is_ok_and(|o| o.status.success()),
        "this test runs `weft chat` under bash in the tmux pane, and bash is not installed"
    );
}

/// A private tmux server (its own socket, no user configuration) with one pane running a
/// command; the server is killed when this is dropped.
struct Tmux {
    socket: String,
}

const PANE: &str = "chat";

impl Tmux {
    fn start(command: &[&str], dir: &Path) -> Tmux {
        ensure_tmux();
        let conf = dir.join("tmux.conf");
        // Keep the pane when the program ends, to read how it ended.
        std::fs::write(
            &conf,
            "set -g remain-on-exit on\nset -g history-limit 50000\n",
        )
        .expect("write tmux.conf");
        // A server of its own per session: tests run side by side.
        static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmux = Tmux {
            socket: format!("weft-chat-test-{}-{n}", std::process::id()),
        };
        let conf = conf.to_str().expect("utf-8 path");
        let args = [
            "-f",
            conf,
            "new-session",
            "-d",
            "-s",
            PANE,
            "-x",
            "200",
            "-y",
            "50",
        ];
        tmux.run(&[&args[..], command].concat());
        tmux
    }

    /// A pane running bash `script`, in which `$0` is the weft binary under test.
    fn run_script(script: &str, dir: &Path) -> Tmux {
        let weft = PathBuf::from(env!("CARGO_BIN_EXE_weft"));
        let command = ["bash", "-c", script, weft.to_str().expect("utf-8 path")];
        Tmux::start(&command, dir)
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .env_remove("TMUX")
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` (literally, no key names).
    fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", PANE, "-l", text]);
    }

    /// Presses a key (`Enter`, `C-c`, ...).
    fn press(&self, key: &str) {
        self.run(&["send-keys", "-t", PANE, key]);
    }

    /// Everything the pane has shown, wrapped lines joined, trailing spaces cut.
    fn screen(&self) -> String {
        let text = self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", PANE]);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        lines.join("\n").trim_end().to_string()
    }

    /// How tmux sees the pane's program (for failure messages).
    fn pane_status(&self) -> String {
        self.run(&[
            "display-message",
            "-p",
            "-t",
            PANE,
            "dead #{pane_dead}, status #{pane_dead_status}, signal #{pane_dead_signal}",
        ])
    }

    /// Waits until `ready(screen)` holds; panics with the screen after `secs` seconds.
    fn wait_for(&self, what: &str, secs: u64, ready: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                panic!(
                    "waited {secs} s for {what}; pane: {}; the screen:\n{screen}",
                    self.pane_status()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .env_remove("TMUX")
            .output();
    }
}

/// How many prompts the screen shows, and whether it ends with an empty one (waiting).
fn prompts(screen: &str) -> (usize, bool) {
    let n = screen.lines().filter(|l| l.starts_with(">>>")).count();
    (n, screen.lines().last() == Some(">>>"))
}

/// A chat in a tmux pane, counting the prompts it has shown.
struct Session {
    tmux: Tmux,
    prompts: usize,
}

impl Session {
    /// Waits for the next empty prompt (the program is waiting for a message) and returns the
    /// screen.
    fn wait_prompt(&mut self, what: &str) -> String {
        let want = self.prompts + 1;
        let screen = self
            .tmux
            .wait_for(what, 120, |s| prompts(s) == (want, true));
        self.prompts = want;
        screen
    }

    /// Sends a message or command, waits for the prompt after it and returns what was
    /// printed between the two (the reply).
    fn send(&mut self, line: &str) -> String {
        self.tmux.type_text(line);
        self.tmux.press("Enter");
        let screen = self.wait_prompt(&format!("the prompt after {line:?}"));
        reply_after(&screen, line)
    }
}

/// What the screen shows after the last line equal to `line` (none if it is not there).
fn after_last(screen: &str, line: &str) -> Option<String> {
    let lines: Vec<&str> = screen.lines().collect();
    let start = lines.iter().rposition(|l| *l == line)?;
    Some(lines[start + 1..].join("\n"))
}

/// What the screen shows between the message `line` and the empty prompt ending it.
fn reply_after(screen: &str, line: &str) -> String {
    let text = after_last(screen, &format!(">>> {line}"))
        .unwrap_or_else(|| panic!("{line:?} is not on the screen:\n{screen}"));
    text.strip_suffix(">>>")
        .unwrap_or_else(|| panic!("no prompt after {line:?}:\n{screen}"))
        .trim()
        .to_string()
}

/// Text without its line breaks and the spaces that end lines (a terminal does not keep
/// those).
fn flat(text: &str) -> String {
    text.lines().map(str::trim_end).collect()
}

/// What the pane prints when weft has ended, before its exit status and `]`.
const EXITED: &str = "[weft exited with status ";

/// On a terminal the line editor cannot drive (`TERM=dumb`, as Emacs' shell sets) chat reads
/// plain lines: it answers, and Ctrl-D ends it (it hung at the first message, both waiting
/// for standard input's lock).
#[test]
fn chat_on_a_dumb_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = format!("TERM=dumb \"$0\" chat -m {MODEL} --temp 0 -n 16; echo \"{EXITED}$?]\"");
    let mut s = Session {
        tmux: Tmux::run_script(&script, dir.path()),
        prompts: 0,
    };
    s.wait_prompt("the model to load and the first prompt");
    let reply = s.send("Hi");
    assert!(!reply.is_empty(), "no reply on a dumb terminal");
    s.tmux.press("C-d");
    let screen = s
        .tmux
        .wait_for("weft to end after Ctrl-D", 30, |s| s.contains(EXITED));
    assert!(screen.contains(&format!("{EXITED}0]")), "{screen}");
}

/// Ctrl-D at the continuation prompt after a line ending in `\` sends the message so far (as
/// the end of a pipe does); it was dropped, and the chat ended.
#[test]
fn ctrl_d_after_a_continued_line_sends_the_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = format!("\"$0\" chat -m {MODEL} --temp 0 -n 8; echo \"{EXITED}$?]\"");
    let mut s = Session {
        tmux: Tmux::run_script(&script, dir.path()),
        prompts: 0,
    };
    s.wait_prompt("the model to load and the first prompt");
    s.tmux.type_text("Say hi\\");
    s.tmux.press("Enter");
    s.tmux.wait_for("the continuation prompt", 30, |screen| {
        screen.lines().last().is_some_and(|l| l.starts_with("..."))
    });
    s.tmux.press("C-d");
    s.wait_prompt("the prompt after the message Ctrl-D sent");
    let saved = dir.path().join("sent.json");
    s.send(&format!("/save {}", saved.display()));
    let kept = read_messages(&saved);
    assert_eq!(roles(&kept), ["user", "assistant"]);
    assert_eq!(kept[0].content.trim(), "Say hi");
    s.tmux.press("C-d");
    let screen = s
        .tmux
        .wait_for("weft to end after Ctrl-D", 30, |s| s.contains(EXITED));
    assert!(screen.contains(&format!("{EXITED}0]")), "{screen}");
}

/// A chat at a terminal whose replies go to a reader that leaves (`| head -c 5`) ends quietly
/// and successfully, as `weft run | head` does (it panicked on the broken pipe).
#[test]
fn chat_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = format!(
        "\"$0\" chat -m {MODEL} --temp 0 -n 64 | head -c 5; s=${{PIPESTATUS[0]}}; echo; \
         echo \"{EXITED}$s]\""
    );
    let tmux = Tmux::run_script(&script, dir.path());
    tmux.wait_for("the banner", 120, |s| s.contains("/help"));
    tmux.type_text("Tell me a long story about a dragon.");
    tmux.press("Enter");
    let screen = tmux.wait_for("weft to end", 60, |s| s.contains(EXITED));
    assert!(screen.contains(&format!("{EXITED}0]")), "{screen}");
    assert!(!screen.contains("panicked"), "{screen}");
}

#[test]
fn chat_in_a_terminal() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 256;
    // bash runs weft and reports how it ended: tmux itself sometimes never collects the exit
    // status of a pane's program. Without job control bash survives the Ctrl-C weft catches
    // (it exits on SIGINT only if its child died of it).
    let script = format!("\"$0\" chat -m {MODEL} --temp 0 -n {n}; echo \"{EXITED}$?]\"");
    let mut s = Session {
        tmux: Tmux::run_script(&script, dir.path()),
        prompts: 0,
    };
    let screen = s.wait_prompt("the model to load and the first prompt");
    assert!(screen.contains("/help"), "a banner names /help:\n{screen}");

    // A first message, then one that needs the history.
    let first = s.send("My name is Ada. Please remember it.");
    assert!(!first.is_empty(), "an empty first reply");
    let second = s.send("What is my name?");
    assert!(!second.is_empty(), "an empty second reply");

    // Ctrl-C during a long reply stops it; the program lives on and answers again.
    s.tmux.type_text("Write a long story about a dragon.");
    s.tmux.press("Enter");
    let ask = "Write a long story about a dragon.";
    s.tmux.wait_for("the story to start", 120, |screen| {
        after_last(screen, &format!(">>> {ask}")).is_some_and(|t| t.len() > 40)
    });
    s.tmux.press("C-c");
    let screen = s.wait_prompt("the prompt after Ctrl-C");
    let story = reply_after(&screen, ask);
    assert!(
        !screen.contains(EXITED),
        "Ctrl-C ended the program:\n{screen}"
    );
    let thanks = s.send("Thanks!");
    assert!(!thanks.is_empty(), "no reply after Ctrl-C");

    // Ctrl-C at the prompt drops the line typed so far and gives a hint.
    s.tmux.type_text("never sent");
    s.tmux.press("C-c");
    let screen = s.wait_prompt("the hint after Ctrl-C at the prompt");
    assert!(screen.contains("Use /exit or Ctrl-D to quit."), "{screen}");

    // /save writes the conversation as JSON messages.
    let saved = dir.path().join("chat.json");
    let out = s.send(&format!("/save {}", saved.display()));
    assert!(out.contains("saved 8 messages"), "{out}");
    let conversation = read_messages(&saved);
    assert_eq!(
        roles(&conversation),
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert_eq!(
        conversation[0].content,
        "My name is Ada. Please remember it."
    );
    assert_eq!(conversation[2].content, "What is my name?");
    assert_eq!(conversation[6].content, "Thanks!");
    for (i, shown) in [(1, &first), (3, &second), (7, &thanks)] {
        let line = conversation[i].content.lines().next().unwrap_or_default();
        assert!(
            shown.contains(line.trim_end()),
            "reply {i} on screen:\n{shown}"
        );
    }
    // The screen shows the kept part of the story and the ^C the terminal echoes (where the
    // key came: a step already sampled may print after it).
    assert_eq!(
        flat(&story.replace("^C", "")),
        flat(&conversation[5].content),
        "the interrupted reply on screen and in history"
    );

    // /reset forgets: the same question, without the history, as a fresh conversation.
    let out = s.send("/reset");
    assert!(out.contains("conversation cleared"), "{out}");
    s.send("What is my name?");
    let after_reset = dir.path().join("reset.json");
    s.send(&format!("/save {}", after_reset.display()));
    let fresh = read_messages(&after_reset);
    assert_eq!(roles(&fresh), ["user", "assistant"]);

    // /load restores it: the next reply follows the loaded history.
    let out = s.send(&format!("/load {}", saved.display()));
    assert!(out.contains("loaded 8 messages"), "{out}");
    s.send("Say my name again.");
    let after_load = dir.path().join("load.json");
    s.send(&format!("/save {}", after_load.display()));
    let loaded = read_messages(&after_load);
    assert_eq!(loaded.len(), 10);
    assert_eq!(loaded[..8], conversation[..]);
    assert_eq!(loaded[8], Message::user("Say my name again."));

    // The line editor: arrow keys move in the line; a line longer than the 4,095 bytes a
    // terminal's own line editing keeps arrives whole (it was cut there, silently).
    s.send("/reset");
    s.tmux.type_text("Sa hi");
    for _ in 0..3 {
        s.tmux.press("Left");
    }
    s.tmux.type_text("y");
    s.tmux.press("Enter");
    s.wait_prompt("the reply to an edited line");
    let long = format!("Repeat: {}END", "abcdefghi ".repeat(600));
    s.tmux.type_text(&long);
    s.tmux.press("Enter");
    s.wait_prompt("the reply to a long line");
    let edited = dir.path().join("edited.json");
    s.send(&format!("/save {}", edited.display()));
    let kept = read_messages(&edited);
    assert_eq!(roles(&kept), ["user", "assistant", "user", "assistant"]);
    assert_eq!(kept[0].content, "Say hi");
    assert_eq!(kept[2].content.len(), long.len());
    assert_eq!(kept[2].content, long);

    // A line that is not UTF-8 (a terminal in Latin-1) loses that message, not the session.
    s.tmux.type_text("caf");
    s.tmux.run(&["send-keys", "-t", PANE, "-H", "e9"]);
    s.tmux.press("Enter");
    let screen = s.wait_prompt("the prompt after a line that is not UTF-8");
    assert!(screen.contains("that line is not UTF-8 text"), "{screen}");

    // Ctrl-C while the model reads a long conversation stops it within a pass (it was
    // ignored until the reply began); the message is taken back out, no empty reply kept.
    let long = dir.path().join("long.json");
    let text = "The cat sat on the mat and looked at the door for a while. ".repeat(400);
    let story = vec![Message::user(text), Message::assistant("It did.")];
    std::fs::write(&long, serde_json::to_string(&story).expect("json")).expect("write");
    let out = s.send(&format!("/load {}", long.display()));
    assert!(out.contains("loaded 2 messages"), "{out}");
    s.tmux.type_text("Why?");
    s.tmux.press("Enter");
    s.tmux.wait_for("the message to go", 30, |screen| {
        screen.lines().last() == Some(">>> Why?")
    });
    std::thread::sleep(Duration::from_millis(300));
    s.tmux.press("C-c");
    let screen = s.wait_prompt("the prompt after Ctrl-C while the model reads");
    assert!(
        screen.contains("stopped before the reply began; the message was not kept"),
        "{screen}"
    );
    let withdrawn = dir.path().join("withdrawn.json");
    s.send(&format!("/save {}", withdrawn.display()));
    assert_eq!(read_messages(&withdrawn), story);

    // /exit ends the program, successfully.
    s.tmux.type_text("/exit");
    s.tmux.press("Enter");
    let screen = s
        .tmux
        .wait_for("weft to end after /exit", 30, |s| s.contains(EXITED));
    assert!(
        screen.contains(&format!("{EXITED}0]")),
        "weft did not end successfully:\n{screen}"
    );
    let session_secs = t0.elapsed().as_secs_f64();

    // Every reply is the library's greedy reply to the conversation before it; the
    // interrupted one is a strict start of it; history changes the answer to the question.
    let engine = Engine::load(MODEL).expect("load the model");
    check_replies(&engine, &conversation, n, &[5]);
    check_replies(&engine, &fresh, n, &[]);
    assert_eq!(
        loaded[9].content,
        greedy_reply(&engine, &loaded[..9], n),
        "the reply after /load"
    );
    assert_ne!(
        conversation[3].content, fresh[1].content,
        "the second reply should depend on the first turn"
    );
    eprintln!(
        "chat session {session_secs:.1} s, total {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
