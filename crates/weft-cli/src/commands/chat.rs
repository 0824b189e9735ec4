//! `weft chat -m MODEL [--system TEXT] [sampling flags]`: a conversation in the terminal with
//! the model's chat template, replies streamed, the history kept; `/reset`, `/save FILE`,
//! `/load FILE` (the conversation as JSON messages), `/exit`.
//!
//! Key design decision: one [`weft::Context`] lives through the whole conversation. Before a
//! reply the whole conversation goes to [`weft::Context::fill_chat`]: the context keeps the
//! longest start of its tokens that the new rendering shares and runs only the rest. So the
//! prompt is always the full rendering of the history (what a fresh context would be given,
//! whatever the template does to earlier turns), yet a follow-up turn computes only its own
//! tokens, plus whatever tail of the last reply tokenizes differently from how it was
//! generated.
//!
//! Ctrl-C during a reply stops it and returns to the prompt; the text already printed stays in
//! the conversation as the assistant's message (what is on screen is what the model remembers,
//! as in llama.cpp's interactive mode). Ctrl-C at the prompt discards the line and prints a hint,
//! as ollama does; `/exit` or Ctrl-D quits. At a terminal the line is edited with rustyline
//! (arrow keys, history; its prompts go to the terminal, not to standard output). When stdin
//! is not a terminal, each line is a user turn, only the replies are printed (one line break
//! after each), a failing turn is an error and Ctrl-C ends the program.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use weft::{block_on, Context, Engine, Message, Penalties, Sampler, StopReason};

use crate::model_arg::{ContextArg, ModelArg, ThreadsArg};
use crate::replacing_file::ReplacingFile;
use crate::sampling_arg::SamplingArg;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    context: ContextArg,
    #[command(flatten)]
    sampling: SamplingArg,
    /// Longest reply, in tokens (a reply also ends at the model's end-of-turn token, and
    /// Ctrl-C stops it at once); -1: no limit but the context, as in llama.cpp.
    #[arg(short = 'n', long = "n-predict", default_value = "512", allow_negative_numbers = true,
        value_parser = crate::sampling_arg::parse_n_predict)]
    n_predict: usize,
    /// A system message opening the conversation (`/reset` keeps it).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
}

/// The prompt of a new message, and of its continuation lines (after a line ending in `\`).
const PROMPT: &str = ">>> ";
const CONTINUATION: &str = "... ";
/// Tokens a pass reads of a long prompt between two looks at Ctrl-C (about half a second).
const PREFILL_CHUNK: usize = 512;

const HELP: &str = "\
/reset       forget the conversation (the --system message stays)
/save FILE   write the conversation to FILE as JSON messages
/load FILE   replace the conversation with the one in FILE
/exit        quit (also /bye, Ctrl-D)
/help        this list
End a line with \\ to go on with the message on the next line. Begin a message with // to
send one that starts with /. Ctrl-C stops a reply.";

pub fn run(args: Args) -> anyhow::Result<()> {
    // Every reply would be empty, and kept so in the conversation.
    anyhow::ensure!(
        args.n_predict >= 1,
        "-n must be at least 1 (the longest reply)"
    );
    let sampler = args.sampling.sampler()?;
    let penalties = args.sampling.penalties()?;
    args.threads.check()?;
    args.context.check()?;
    let path = args.model.path()?;
    let engine = args
        .model
        .engine(&path, args.context.engine_config(&args.threads)?)?;
    if engine.chat_template()?.is_builtin() {
        // Such as gemma3-270m: a pretrained model, which answers a chat poorly.
        errln!(
            "note: {} has no chat template of its own (a base model?): weft uses its family's \
             built-in format",
            args.model.model
        );
    }
    let bias = args.sampling.logit_bias(&engine)?;
    let seed = args.sampling.seed();
    let mut chat = Chat::new(engine, &args, seed, sampler, penalties, bias);
    // A seed drawn from the clock is named, as `weft run` names it: the replies can be had
    // again.
    if !args.sampling.is_greedy() && args.sampling.seed.and_then(|s| s.0).is_none() {
        errln!("(sampling with seed {seed}; --seed {seed} gives these replies again)");
    }
    let interactive = std::io::stdin().is_terminal();
    let ctrl_c = if interactive {
        CtrlC::install()?
    } else {
        // Nothing watches the signal: Ctrl-C ends the program as usual.
        Arc::new(CtrlC::default())
    };
    if interactive {
        errln!(
            "Chatting with {}. /help lists the commands; Ctrl-C stops a reply, /exit or Ctrl-D quits.",
            args.model.model
        );
    }
    // At a terminal, rustyline edits the line (arrow keys, history, pastes past the 4,095
    // bytes a terminal's own line editing keeps); where it cannot, the terminal's lines.
    let mut editor = interactive.then(line_editor).flatten();
    ctrl_c.line_editor.store(editor.is_some(), Ordering::SeqCst);
    loop {
        let message = match &mut editor {
            Some(ed) => edit_message(ed)?,
            None => {
                if interactive {
                    print_flush(PROMPT)?;
                }
                // Locked for this read only: rustyline, on a terminal it cannot drive
                // (TERM=dumb), locks standard input itself, and a lock held here would
                // deadlock it. The buffer lives in `Stdin`, so nothing read ahead is lost.
                read_message(&mut std::io::stdin().lock(), interactive, &ctrl_c)?
            }
        };
        let Some(message) = message else {
            if interactive {
                // Ends the prompt's line on the terminal (standard output may be a file).
                errln!();
            }
            return Ok(());
        };
        let message = message.trim();
        if message.is_empty() {
            continue;
        }
        // `//` sends a message that begins with `/` (a path, say); one `/` starts a command.
        let message = match message.strip_prefix("//") {
            Some(_) => &message[1..],
            None => {
                if let Some(command) = message.strip_prefix('/') {
                    match chat.command(command) {
                        Ok(Flow::Exit) => return Ok(()),
                        Ok(Flow::Continue) => {}
                        Err(e) if interactive => errln!("error: {e:#}"),
                        Err(e) => return Err(e),
                    }
                    continue;
                }
                message
            }
        };
        ctrl_c.start_reply();
        let keep_output = interactive.then(KeepOutput::on_stdin);
        let result = chat.reply(message, &ctrl_c.stop);
        drop(keep_output);
        ctrl_c.end_reply();
        match result {
            Ok(ending) => {
                print_flush(if interactive { "\n\n" } else { "\n" })?;
                match ending {
                    // On standard error, as the other endings: a script reading the
                    // replies from standard output still learns that one was cut.
                    Ending::Cut => errln!(
                        "(reply cut at {} tokens; -n sets the limit)",
                        args.n_predict
                    ),
                    Ending::ContextFull(n) => errln!(
                        "(reply cut at the end of the context, {n} tokens; /reset starts \
                         afresh, -c sets a longer context)"
                    ),
                    Ending::Withdrawn => {
                        errln!("(stopped before the reply began; the message was not kept)")
                    }
                    _ => {}
                }
            }
            // A closed standard output ends the chat quietly (main's broken-pipe rule).
            Err(e) if interactive && !crate::is_broken_pipe(&e) => {
                let _ = outln!();
                errln!("error: {e:#}");
            }
            Err(e) => return Err(e),
        }
    }
}

/// A line editor on the terminal (its prompts go to the terminal, not to standard output),
/// or `None` where there is none to be had.
fn line_editor() -> Option<rustyline::DefaultEditor> {
    let config = rustyline::Config::builder()
        .behavior(rustyline::Behavior::PreferTerm)
        .auto_add_history(false)
        .build();
    rustyline::DefaultEditor::with_config(config).ok()
}

/// Reads one message with the line editor: a line, joined with the next ones while a line
/// ends in `\`. Ctrl-C drops the message being typed; Ctrl-D on an empty line is `None`.
fn edit_message(ed: &mut rustyline::DefaultEditor) -> anyhow::Result<Option<String>> {
    use rustyline::error::ReadlineError;
    let mut message = String::new();
    loop {
        let prompt = if message.is_empty() {
            PROMPT
        } else {
            CONTINUATION
        };
        match ed.readline(prompt) {
            Ok(line) => match line.strip_suffix('\\') {
                Some(start) => {
                    message.push_str(start);
                    message.push('\n');
                }
                None => {
                    message.push_str(&line);
                    let _ = ed.add_history_entry(message.as_str());
                    return Ok(Some(message));
                }
            },
            Err(ReadlineError::Interrupted) => {
                errln!("^C\n(Use /exit or Ctrl-D to quit.)");
                message.clear();
            }
            // Ctrl-D after a `\` line: the message so far is sent, as from a pipe.
            Err(ReadlineError::Eof) if !message.is_empty() => {
                let _ = ed.add_history_entry(message.as_str());
                return Ok(Some(message));
            }
            Err(ReadlineError::Eof) => return Ok(None),
            // A terminal in another encoding: that message is lost, not the conversation.
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                errln!("\nerror: that line is not UTF-8 text; the message was dropped");
                message.clear();
            }
            Err(e) => return Err(e).context("cannot read the terminal"),
        }
    }
}

/// Reads one message: a line, joined with the next ones while a line ends in `\`. `None` at
/// the end of the input (after a message in progress, which is returned first).
fn read_message(
    input: &mut impl BufRead,
    interactive: bool,
    ctrl_c: &CtrlC,
) -> anyhow::Result<Option<String>> {
    let mut message = String::new();
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        if input
            .read_until(b'\n', &mut bytes)
            .context("cannot read stdin")?
            == 0
        {
            return Ok((!message.is_empty()).then_some(message));
        }
        if ctrl_c.discard_input.swap(false, Ordering::SeqCst) {
            // Ctrl-C at the prompt dropped the lines typed so far (the terminal drops the
            // line it was editing).
            message.clear();
        }
        let line = match std::str::from_utf8(&bytes) {
            Ok(line) => line,
            // A terminal in another encoding: that message is lost, not the conversation.
            Err(_) if interactive => {
                errln!("error: that line is not UTF-8 text; the message was dropped");
                message.clear();
                print_flush(PROMPT)?;
                continue;
            }
            Err(e) => anyhow::bail!("cannot read stdin: a line is not UTF-8 text ({e})"),
        };
        let line = line.trim_end_matches(['\n', '\r']);
        match line.strip_suffix('\\') {
            Some(start) => {
                message.push_str(start);
                message.push('\n');
                if interactive {
                    print_flush(CONTINUATION)?;
                }
            }
            None => {
                message.push_str(line);
                return Ok(Some(message));
            }
        }
    }
}

fn print_flush(s: &str) -> std::io::Result<()> {
    // A lock per write: the Ctrl-C thread prints too, while this one waits for input.
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()
}

/// What the main loop does after a command.
enum Flow {
    Continue,
    Exit,
}

/// How a reply ended.
#[derive(Debug, PartialEq, Eq)]
enum Ending {
    /// At the model's end of turn.
    Done,
    /// At `--n-predict` tokens.
    Cut,
    /// At the end of the context (of this many tokens).
    ContextFull(usize),
    /// By Ctrl-C.
    Interrupted,
    /// By Ctrl-C before the reply began: the message was taken back out.
    Withdrawn,
}

/// The conversation and the context holding its KV cache.
struct Chat {
    engine: Engine,
    ctx: Context,
    system: Option<String>,
    messages: Vec<Message>,
    sampler: Sampler,
    penalties: Option<Penalties>,
    /// `--logit-bias`, checked against the vocabulary.
    bias: Vec<(u32, f32)>,
    n_predict: usize,
}

impl Chat {
    fn new(
        engine: Engine,
        args: &Args,
        seed: u64,
        sampler: Sampler,
        penalties: Option<Penalties>,
        bias: Vec<(u32, f32)>,
    ) -> Chat {
        let mut ctx = engine.context();
        ctx.set_seed(seed);
        let mut chat = Chat {
            engine,
            ctx,
            // An empty --system is no system message, not an empty one.
            system: args.system.clone().filter(|s| !s.trim().is_empty()),
            messages: Vec::new(),
            sampler,
            penalties,
            bias,
            n_predict: args.n_predict,
        };
        chat.reset();
        chat
    }

    /// Back to the start: only the `--system` message, if any.
    fn reset(&mut self) {
        self.messages = self.system.iter().map(Message::system).collect();
    }

    /// Runs a `/command` (without its slash).
    fn command(&mut self, line: &str) -> anyhow::Result<Flow> {
        let line = line.trim_start(); // `/ reset` too
        let (name, arg) = line
            .split_once(char::is_whitespace)
            .map_or((line, ""), |(name, arg)| (name, arg.trim()));
        let file = || {
            anyhow::ensure!(!arg.is_empty(), "usage: /{name} FILE");
            // `~/` is the home directory, as a shell would read it.
            Ok(match (arg.strip_prefix("~/"), std::env::var_os("HOME")) {
                (Some(rest), Some(home)) => Path::new(&home).join(rest),
                _ => PathBuf::from(arg),
            })
        };
        match name {
            "exit" | "bye" | "quit" => return Ok(Flow::Exit),
            "reset" | "clear" => {
                self.reset();
                errln!("(conversation cleared)");
            }
            "save" => {
                let f = &file()?;
                // Written whole before it replaces the file: a full disk or a Ctrl-C does
                // not cost the conversation saved there before.
                let out = ReplacingFile::create(f, "save the conversation")?;
                out.write(|w| {
                    serde_json::to_writer_pretty(&mut *w, &self.messages)?;
                    w.write_all(b"\n")
                })?;
                errln!(
                    "(saved {} to {})",
                    messages(self.messages.len()),
                    f.display()
                );
            }
            "load" => {
                let f = &file()?;
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("cannot read {}", f.display()))?;
                let messages: Vec<Message> = serde_json::from_str(&text).with_context(|| {
                    format!(
                        "{} is not a JSON array of messages ({{\"role\": …, \"content\": …}})",
                        f.display()
                    )
                })?;
                // Roles the chat templates know (as the server checks them): another would
                // be rendered as a turn of a speaker the model has never seen.
                if let Some((i, m)) = messages.iter().enumerate().find(|(_, m)| {
                    !matches!(
                        m.role.as_str(),
                        "system" | "developer" | "user" | "assistant" | "tool"
                    )
                }) {
                    anyhow::bail!(
                        "{}: message {} has an unknown role '{}' (system, user, assistant or \
                         tool)",
                        f.display(),
                        i + 1,
                        m.role
                    );
                }
                // Refuse a conversation the template rejects now, not at the next message.
                self.engine
                    .chat_template()?
                    .render(&messages, true)
                    .with_context(|| format!("cannot use the conversation in {}", f.display()))?;
                errln!(
                    "(loaded {} from {})",
                    self::messages(messages.len()),
                    f.display()
                );
                self.messages = messages;
            }
            "help" | "?" => errln!("{HELP}"),
            _ => anyhow::bail!(
                "unknown command /{name}; /help lists the commands (start a message with // to \
                 send one that begins with /)"
            ),
        }
        Ok(Flow::Continue)
    }

    /// Answers `message`, streaming the reply to stdout until the model ends its turn, the
    /// reply reaches `--n-predict` tokens or `stop` is set. Both messages join the
    /// conversation, the reply as far as it was printed; a turn that fails leaves no trace.
    fn reply(&mut self, message: &str, stop: &AtomicBool) -> anyhow::Result<Ending> {
        self.messages.push(Message::user(message));
        let mut reply = String::new();
        match self.generate(&mut reply, stop) {
            // Stopped before the reply began (while the model read the conversation, or
            // before its first token): the exchange did not happen.
            Ok(Ending::Interrupted) if reply.is_empty() => {
                self.messages.pop();
                Ok(Ending::Withdrawn)
            }
            Ok(ending) => {
                self.messages.push(Message::assistant(reply));
                Ok(ending)
            }
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }

    fn generate(&mut self, reply: &mut String, stop: &AtomicBool) -> anyhow::Result<Ending> {
        self.fill_prompt()?;
        // The conversation's new tokens are read in passes of `PREFILL_CHUNK`, so that
        // Ctrl-C stops a long one within a pass (a loaded conversation of 6,000 tokens took
        // 19 s in one); the last token stays for the generation's first step.
        let pending = self.ctx.pending().to_vec();
        if pending.len() > PREFILL_CHUNK {
            let (read, last) = pending.split_at(pending.len() - 1);
            self.ctx.truncate(self.ctx.len())?;
            for chunk in read.chunks(PREFILL_CHUNK) {
                if stop.load(Ordering::SeqCst) {
                    return Ok(Ending::Interrupted);
                }
                let mut pass = self.ctx.forward();
                pass.input(chunk);
                block_on(pass.execute())?;
            }
            self.ctx.fill_tokens(last)?;
        }
        // A reply ends at the context's end rather than failing there.
        let held = self.ctx.len() + self.ctx.pending().len();
        let n_ctx = self.engine.n_ctx();
        // Only earlier turns can be dropped: a system message and this one are what /reset keeps.
        let earlier = self.messages.len() > self.system.iter().count() + 1;
        let hint = if earlier {
            "/reset starts afresh, "
        } else {
            ""
        };
        anyhow::ensure!(
            held < n_ctx,
            "the conversation has {held} tokens, which leaves no room in the context of \
             {n_ctx}: {hint}-c sets a longer context"
        );
        let room = n_ctx - held;
        let mut g = self
            .ctx
            .generate(self.sampler.clone())
            .max_tokens(self.n_predict.min(room));
        if let Some(p) = &self.penalties {
            g = g.penalties(p.clone());
        }
        g = g.logit_bias(&self.bias);
        loop {
            let delta = block_on(g.next_text())?;
            // Text of a step Ctrl-C came during is neither shown nor kept.
            if stop.load(Ordering::SeqCst) {
                return Ok(Ending::Interrupted);
            }
            let Some(delta) = delta else {
                break;
            };
            print_flush(&delta)?;
            reply.push_str(&delta);
        }
        Ok(match g.stop_reason() {
            Some(StopReason::MaxTokens) if room < self.n_predict => Ending::ContextFull(n_ctx),
            Some(StopReason::ContextFull) => Ending::ContextFull(n_ctx),
            Some(StopReason::MaxTokens) => Ending::Cut,
            _ => Ending::Done,
        })
    }

    /// Buffers the prompt of the conversation in the context: the tokens of its rendering, of
    /// which the context keeps the longest start it already holds.
    fn fill_prompt(&mut self) -> anyhow::Result<()> {
        self.ctx.fill_chat(&self.messages)?;
        tracing::debug!(
            prompt = self.ctx.len() + self.ctx.pending().len(),
            kept = self.ctx.len(),
            "chat prompt"
        );
        Ok(())
    }
}

/// What Ctrl-C does when stdin is a terminal: stop the reply in progress, or at the prompt,
/// drop the line and print a hint.
#[derive(Default)]
struct CtrlC {
    /// A reply is being generated.
    replying: AtomicBool,
    /// Stop the reply in progress.
    stop: AtomicBool,
    /// Ctrl-C came at the prompt: drop the lines of the message typed so far.
    discard_input: AtomicBool,
    /// Messages are read with the line editor, which takes Ctrl-C at the prompt itself.
    line_editor: AtomicBool,
}

impl CtrlC {
    /// Catches SIGINT from now on, on a thread of its own.
    fn install() -> anyhow::Result<Arc<CtrlC>> {
        let state = Arc::new(CtrlC::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Registered here, so that no Ctrl-C after this returns can end the program.
        #[cfg(unix)]
        let mut signal = {
            let _rt = rt.enter();
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .context("cannot catch Ctrl-C")?
        };
        let s = state.clone();
        std::thread::Builder::new()
            .name("ctrl-c".into())
            .spawn(move || {
                rt.block_on(async move {
                    #[cfg(unix)]
                    while signal.recv().await.is_some() {
                        s.on_ctrl_c();
                    }
                    #[cfg(not(unix))]
                    while tokio::signal::ctrl_c().await.is_ok() {
                        s.on_ctrl_c();
                    }
                })
            })?;
        Ok(state)
    }

    fn on_ctrl_c(&self) {
        if self.replying.load(Ordering::SeqCst) {
            self.stop.store(true, Ordering::SeqCst);
        } else if self.line_editor.load(Ordering::SeqCst) {
            // Between two messages (a command running): the editor's prompt follows.
            errln!("\n(Use /exit or Ctrl-D to quit.)");
        } else {
            self.discard_input.store(true, Ordering::SeqCst);
            let _ = print_flush(&format!("\n(Use /exit or Ctrl-D to quit.)\n{PROMPT}"));
        }
    }

    fn start_reply(&self) {
        self.stop.store(false, Ordering::SeqCst);
        self.replying.store(true, Ordering::SeqCst);
    }

    fn end_reply(&self) {
        self.replying.store(false, Ordering::SeqCst);
    }
}

/// While a reply streams, the terminal keeps its output when Ctrl-C comes. By default (without
/// `NOFLSH`) the kernel discards, on the interrupt key, what the program wrote that the terminal
/// had not shown yet: the screen would lose the last words of a reply that the conversation
/// keeps. The setting is restored when this is dropped, so that at the prompt Ctrl-C still
/// drops the line being typed.
struct KeepOutput {
    /// The terminal's settings before (none when they could not be read or changed).
    #[cfg(unix)]
    saved: Option<rustix::termios::Termios>,
}

impl KeepOutput {
    fn on_stdin() -> KeepOutput {
        #[cfg(unix)]
        {
            use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
            let stdin = std::io::stdin();
            let saved = tcgetattr(&stdin).ok().filter(|t| {
                let mut keep = t.clone();
                keep.local_modes |= LocalModes::NOFLSH;
                tcsetattr(&stdin, OptionalActions::Now, &keep).is_ok()
            });
            KeepOutput { saved }
        }
        #[cfg(not(unix))]
        KeepOutput {}
    }
}

impl Drop for KeepOutput {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(saved) = &self.saved {
            let stdin = std::io::stdin();
            let _ =
                rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, saved);
        }
    }
}

/// "1 message", "3 messages".
fn messages(n: usize) -> String {
    crate::count(n, "message")
}
