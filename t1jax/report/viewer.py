"""The self-contained trajectory viewer (``report/trajectories.html``) of a run's eval trials.

Per trial: the instruction, the conversation turn by turn with the trained (loss-masked) tokens
highlighted, the commands and their shell output, the verifier's per-assertion results and the
reward. Model output is untrusted: every string goes through ``html.escape`` and the page's only
script is ours (filters), which never turns data into markup.
"""

from __future__ import annotations

import html
from pathlib import Path

from t1jax.metrics_log import finite_or_none as _num, format_value as _fmt

VIEWER_FILE = "trajectories.html"


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f4f6f8}
header{position:sticky;top:0;z-index:2;background:#fff;border-bottom:1px solid #d5dbe1;padding:10px 16px}
h1{font-size:18px;margin:0 0 6px}
.controls{display:flex;flex-wrap:wrap;gap:10px;align-items:center}
.controls label{font-size:13px;color:#4a5560}
select,input{font:inherit;padding:3px 6px;border:1px solid #b9c2cb;border-radius:4px}
button{font:inherit;padding:3px 10px;border:1px solid #b9c2cb;border-radius:4px;background:#f7f9fa;cursor:pointer}
.legend{display:flex;gap:14px;font-size:12px;color:#4a5560;margin-top:6px;flex-wrap:wrap}
.legend span.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-2px;margin-right:4px}
main{padding:12px 16px}
details.trial{scroll-margin-top:130px;background:#fff;border:1px solid #d5dbe1;border-radius:6px;margin:0 0 8px}
details.trial>summary{cursor:pointer;padding:7px 10px;display:flex;gap:10px;align-items:center;flex-wrap:wrap;list-style:none}
details.trial>summary::-webkit-details-marker{display:none}
details.trial[open]>summary{border-bottom:1px solid #e3e7eb}
.badge{font-size:12px;padding:1px 8px;border-radius:10px;font-weight:600}
.b-resolved{background:#d9f2df;color:#17692b}.b-unresolved{background:#fbe0df;color:#9b1c1c}.b-skipped{background:#e7e9ec;color:#555}
.lbl{font-weight:600;color:#2a5db0}.task{font-family:ui-monospace,Menlo,Consolas,monospace}
.meta{color:#5a6670;font-size:12px}
.body{padding:8px 12px 12px}
h3{font-size:14px;margin:12px 0 6px}
pre{white-space:pre-wrap;word-break:break-word;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;margin:0}
.instr{background:#f7f9fa;border:1px solid #e3e7eb;border-radius:4px;padding:8px;max-height:240px;overflow:auto}
.seg{border-radius:4px;padding:6px 8px;margin:4px 0;max-height:420px;overflow:auto}
.seg .who{font-size:11px;font-weight:700;text-transform:uppercase;letter-spacing:.04em;margin-bottom:3px}
.seg.trained{background:#e4f4e8;border-left:4px solid #2f9e4f}
.seg.context{background:#f1f2f4;border-left:4px solid #aab3bc;color:#39424b}
.cmd{background:#1f2428;color:#e6edf3;border-radius:4px;padding:6px 8px;margin:4px 0 4px 18px}
.cmd .c{color:#7ee787}.cmd .x{color:#8b949e;font-size:11px}.cmd .o{color:#c9d1d9;max-height:260px;overflow:auto;margin-top:4px}
.cmd.bad .x{color:#ff7b72}
table.asserts{border-collapse:collapse;width:100%;font-size:12px}
table.asserts td,table.asserts th{border:1px solid #e3e7eb;padding:3px 6px;text-align:left;vertical-align:top}
tr.pass td.st{background:#d9f2df;color:#17692b;font-weight:600}
tr.fail td.st{background:#fbe0df;color:#9b1c1c;font-weight:600}
tr.other td.st{background:#eee;color:#555}
.reward{font-weight:600}
.hidden{display:none}
#count{font-size:13px;color:#4a5560}
"""

_JS = """
(function(){
  var trials = Array.prototype.slice.call(document.querySelectorAll('details.trial'));
  var fl = document.getElementById('f-label'), ft = document.getElementById('f-task'),
      fo = document.getElementById('f-outcome'), count = document.getElementById('count');
  function apply(){
    var l = fl.value, t = ft.value.trim().toLowerCase(), o = fo.value, shown = 0;
    for (var i = 0; i < trials.length; i++) {
      var d = trials[i].dataset;
      var ok = (!l || d.label === l) && (!t || d.task.toLowerCase().indexOf(t) >= 0) &&
               (!o || d.outcome === o);
      trials[i].classList.toggle('hidden', !ok);
      if (ok) shown++;
    }
    count.textContent = 'showing ' + shown + ' of ' + trials.length + ' trials';
  }
  fl.addEventListener('change', apply); fo.addEventListener('change', apply);
  ft.addEventListener('input', apply);
  document.getElementById('expand').addEventListener('click', function(){
    trials.forEach(function(x){ if (!x.classList.contains('hidden')) x.open = true; }); });
  document.getElementById('collapse').addEventListener('click', function(){
    trials.forEach(function(x){ x.open = false; }); });
  var query = new URLSearchParams(location.search);  // ?label=ppo&task=csv&outcome=resolved
  if (query.has('label')) fl.value = query.get('label');
  if (query.has('task')) ft.value = query.get('task');
  if (query.has('outcome')) fo.value = query.get('outcome');
  if (location.hash) { var el = document.getElementById(location.hash.slice(1));
    if (el && el.tagName === 'DETAILS') { el.open = true; el.scrollIntoView(); } }
  apply();
  var visible = trials.filter(function(x){ return !x.classList.contains('hidden'); });
  if (visible.length && !visible.some(function(x){ return x.open; })) visible[0].open = true;
  document.body.setAttribute('data-viewer-ready', '1');
  console.log('t1jax viewer ready: ' + trials.length + ' trials');
})();
"""


def _outcome(trial: dict) -> str:
    if trial.get("status") == "skipped":
        return "skipped"
    return "resolved" if trial.get("resolved") else "unresolved"


def _assertion_class(status) -> str:
    status = str(status or "").lower()
    if status in ("passed", "pass", "ok", "success"):
        return "pass"
    if status in ("failed", "fail", "error", "errored", "timeout"):
        return "fail"
    return "other"


def _command_html(cmd: dict) -> str:
    code, timed_out = cmd.get("exit_code"), bool(cmd.get("timed_out"))
    status = "timed out" if timed_out else ("exit code ?" if code is None else f"exit code {code}")
    bad = timed_out or (code not in (0, None))
    return (f'<div class="cmd{" bad" if bad else ""}"><pre class="c">$ {_e(cmd.get("command"))}'
            f'</pre><div class="x">{_e(status)}</div>'
            + (f'<pre class="o">{_e(cmd.get("output"))}</pre>' if cmd.get("output") else "")
            + "</div>")


def _conversation_html(trial: dict) -> str:
    """The token sequence turn by turn: context (loss mask 0) and model replies (trained), each
    model reply followed by the commands it ran. ``commands[*].turn`` counts model replies from 0
    (from 1 if the largest turn would otherwise run past the replies)."""
    segments = trial.get("segments") or []
    commands = trial.get("commands") or []
    n_trained = sum(1 for s in segments if s.get("trained"))
    turns = [c.get("turn") for c in commands if isinstance(c.get("turn"), int)]
    offset = 1 if turns and min(turns) >= 1 and max(turns) >= n_trained else 0
    by_turn: dict = {}
    unplaced = []
    for cmd in commands:
        turn = cmd.get("turn")
        if isinstance(turn, int) and 0 <= turn - offset < n_trained:
            by_turn.setdefault(turn - offset, []).append(cmd)
        else:
            unplaced.append(cmd)
    parts, reply, first_context = [], 0, True
    for seg in segments:
        text = seg.get("text", "")
        if seg.get("trained"):
            parts.append(f'<div class="seg trained"><div class="who">model · turn '
                         f'{reply + offset} · trained</div><pre>{_e(text)}</pre></div>')
            parts += [_command_html(c) for c in by_turn.get(reply, [])]
            reply += 1
        else:
            who = "prompt" if first_context else "observation / template"
            first_context = False
            parts.append(f'<div class="seg context"><div class="who">{who} · not trained</div>'
                         f'<pre>{_e(text)}</pre></div>')
    if unplaced:
        parts.append('<h3>Commands not matched to a model turn</h3>')
        parts += [_command_html(c) for c in unplaced]
    if not segments and not commands:
        parts.append('<p class="meta">No conversation recorded.</p>')
    return "".join(parts)


def _trial_html(index: int, trial: dict, open_: bool) -> str:
    outcome = _outcome(trial)
    reward = _num(trial.get("reward"))
    passed, total = trial.get("passed"), trial.get("total")
    head = (f'<span class="badge b-{outcome}">{outcome}</span>'
            f'<span class="lbl">{_e(trial.get("label"))}</span>'
            f'<span class="task">{_e(trial.get("task_id"))}</span>'
            f'<span class="meta">attempt {_e(trial.get("attempt"))}</span>'
            f'<span class="reward">reward {_e(_fmt(reward))}</span>'
            f'<span class="meta">{_e(passed)}/{_e(total)} assertions · {_e(trial.get("turns"))} '
            f'turns · {_e(trial.get("tool_calls"))} tool calls · {_e(trial.get("tokens"))} tokens'
            + (f' · {_e(trial.get("failure_mode"))}'
               if trial.get("failure_mode") not in (None, "", "resolved") else "")
            + "</span>")
    meta = " · ".join(f"{k}: {_e(trial.get(k))}" for k in
                      ("category", "difficulty", "harness", "finish", "sampled_tokens",
                       "duration_s") if trial.get(k) is not None)
    body = [f'<div class="meta">{meta}</div>']
    if trial.get("status") == "skipped":
        body.append(f'<h3>Skipped</h3><pre>{_e(trial.get("skip_reason"))}</pre>')
    body.append(f'<h3>Instruction</h3><pre class="instr">{_e(trial.get("instruction"))}</pre>')
    body.append(f'<h3>Conversation</h3>{_conversation_html(trial)}')
    assertions = trial.get("assertions") or []
    body.append(f'<h3>Verifier: {_e(passed)}/{_e(total)} passed, reward '
                f'{_e(_fmt(reward))}, {"resolved" if trial.get("resolved") else "not resolved"}'
                '</h3>')
    if assertions:
        rows = "".join(f'<tr class="{_assertion_class(a.get("status"))}"><td class="st">'
                       f'{_e(a.get("status"))}</td><td>{_e(a.get("name"))}</td>'
                       f'<td><pre>{_e(a.get("message"))}</pre></td></tr>' for a in assertions)
        body.append('<table class="asserts"><thead><tr><th>status</th><th>assertion</th>'
                    f'<th>message</th></tr></thead><tbody>{rows}</tbody></table>')
    else:
        body.append('<p class="meta">No per-assertion results.</p>')
    if trial.get("verifier_log"):
        body.append('<details><summary>verifier log</summary>'
                    f'<pre class="instr">{_e(trial.get("verifier_log"))}</pre></details>')
    return (f'<details class="trial" id="trial-{index}" data-label="{_e(trial.get("label"))}" '
            f'data-task="{_e(trial.get("task_id"))}" data-outcome="{outcome}"'
            f'{" open" if open_ else ""}><summary>{head}</summary>'
            f'<div class="body">{"".join(body)}</div></details>')


def write_viewer(run: dict, report_dir: Path, workdir: Path) -> Path:
    """``trajectories.html``: every trial of every eval label, self-contained."""
    trials = [dict(t, label=t.get("label") or label)
              for label, data in run["evals"].items() for t in data["trials"]]
    labels = list(run["evals"])
    label_options = "".join(f'<option value="{_e(l)}">{_e(l)} '
                            f'({len(run["evals"][l]["trials"])})</option>' for l in labels)
    items = "".join(_trial_html(i, t, open_=(i == 0)) for i, t in enumerate(trials))
    if not trials:
        items = '<p class="meta">No trials: no eval/&lt;label&gt;/trials.jsonl in this run.</p>'
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>Trajectories: {_e(workdir.name)}</title><style>{_CSS}</style></head>
<body><header><h1>Trajectories · {_e(workdir)}</h1>
<div class="controls">
<label>label <select id="f-label"><option value="">all</option>{label_options}</select></label>
<label>task <input id="f-task" type="search" placeholder="task id contains…"></label>
<label>outcome <select id="f-outcome"><option value="">all</option>
<option value="resolved">resolved</option><option value="unresolved">unresolved</option>
<option value="skipped">skipped</option></select></label>
<button id="expand" type="button">expand all</button>
<button id="collapse" type="button">collapse all</button>
<span id="count">{len(trials)} trials</span></div>
<div class="legend"><span><span class="sw" style="background:#e4f4e8;border:1px solid #2f9e4f"></span>trained tokens (loss mask 1: the model's sampled reply)</span>
<span><span class="sw" style="background:#f1f2f4;border:1px solid #aab3bc"></span>not trained (loss mask 0: prompt, observations, template)</span>
<span><span class="sw" style="background:#1f2428"></span>command run in the sandbox and its output</span>
<span><span class="sw" style="background:#d9f2df"></span>assertion passed</span>
<span><span class="sw" style="background:#fbe0df"></span>assertion failed</span></div>
</header><main>{items}</main><script>{_JS}</script></body></html>
"""
    path = report_dir / VIEWER_FILE
    path.write_text(page, encoding="utf-8")
    return path


