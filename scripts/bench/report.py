"""What scripts/benchmark.py prints: the table of one run's results, and, last, for the project's developers, the
figures its goals are set on beside those goals.

A goal's verdict (`met`) is in the result object only, the one `--json` prints: the table shows what was measured
and what it is compared with. It reads only that object, so a saved run can be printed again with
`table(json.load(open(path)))`.
"""

from typing import Any


def at_least(r: dict[str, Any], targets: tuple[tuple[str, tuple[str, ...], float], ...], prefix: str = ""
             ) -> list[dict[str, Any]]:
    """A section's goals that a figure should reach: (name, its path in the section's result `r`, the least it
    should be), as `goals` rows; a figure the run did not measure is None, neither met nor missed."""
    out = []
    for name, path, limit in targets:
        value: Any = r
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        out.append({"goal": f"{prefix}{name}", "value": value, "limit": limit, "at_least": True,
                    "met": None if value is None else value >= limit})
    return out


def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The numeric goals, each with the measured value and whether it reaches the goal."""
    out = []

    def goal(name: str, value: float | None, limit: float, at_least: bool) -> None:
        met = None if value is None else (value >= limit if at_least else value <= limit)
        out.append({"goal": name, "value": value, "limit": limit, "at_least": at_least, "met": met})

    for section in ("demo", "bench", "e2b"):
        r = result.get(section)
        if r:
            goal(f"{section}: ours plain / transformers plain", r["ratios"].get("ours_plain/tf_plain"), 2.0, True)
            goal(f"{section}: ours speculative / transformers assisted", r["ratios"].get("ours_spec/tf_assisted"),
                 2.0, True)
            if "ours_plain/ours_plain_pack_false" in r["ratios"]:
                goal(f"{section}: plain decode, fast / fast=False", r["ratios"]["ours_plain/ours_plain_pack_false"],
                     1.0, True)
            goal(f"{section}: identical tokens (1 = yes)", float(r["identical"]), 1.0, True)
    if result.get("demo"):
        goal("demo: ATen calls per decode step of the target", result["demo"]["aten_calls_per_decode_step"]["ours"],
             2500, False)
    for key, label, fraction in (("", "e2b", 0.85), ("bf16", "e2b bf16", 0.80)):
        r = result.get(key, {}) if key else result
        if r.get("costs"):
            verify = r["costs"]["verify_over_decode"]
            if not key:
                goal(f"{label}: draft step / decode step", r["costs"]["draft_step_over_decode"], 0.10, False)
            goal(f"{label}: 5-token verify / 1-token decode", verify[4], 1.25, False)
            if not key:
                goal(f"{label}: implied speedup at acceptance 0.7, best K",
                     r["costs"]["implied_speedup"]["0.7"]["speedup"], 2.0, True)
        if r.get("bandwidth"):
            goal(f"{label}: decode / memory-bandwidth bound", r["bandwidth"]["fraction_decode_step"], fraction, True)
            goal(f"{label}: decode / bound, paired by repetition", r["bandwidth"]["fraction_paired"], fraction, True)
    if result.get("memory"):
        goal("first-forward peak / weights as loaded (bf16)", result["memory"]["forward_peak_over_text"], 1.15, False)
    return out


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def threads_line(result: dict[str, Any]) -> list[str]:
    """The torch threads each section ran with (bench/timing.py `section_threads`)."""
    ran = result.get("threads")
    if not ran:
        return []
    return [f"torch threads: {', '.join(f'{name} {n}' for name, n in ran.items())} (scripts/cli/threads.py's rule "
            f"for each section's model; --threads N sets all)"]


def threads_of(n: int | None) -> str:
    return "" if n is None else f", {n} torch thread{'s' if n != 1 else ''}"


def table(result: dict[str, Any]) -> str:
    lines = [f"machine: {result['machine']}", *threads_line(result)]
    for section in ("demo", "bench", "e2b"):
        r = result.get(section)
        if not r:
            continue
        lines += ["", f"== {section}: {r['target']} + {r['assistant']}",
                  f"   prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new, K = {r['k']}, "
                  f"{r['reps']} timed reps{threads_of(r.get('threads'))}; transformers {r['transformers']}",
                  *([f"   {r['note']}"] if r.get("note") else []),
                  f"   {'method':<32}{'tokens/s':>10}{'acceptance':>12}"]
        names = {"ours_plain": "ours, plain greedy", "ours_spec": "ours, speculative",
                 "ours_plain_pack_false": "ours, plain greedy, fast=False",
                 "tf_plain": "transformers generate", "tf_assisted": "transformers assisted generate"}
        for name, label in names.items():
            m = r["methods"].get(name)
            if m is None and name == "ours_plain_pack_false":
                continue
            rate = fmt(m and m["acceptance_rate"], ".3f") if name in ("ours_spec", "tf_assisted") else ""
            lines.append(f"   {label:<32}{fmt(m and m['tokens_per_s'], '.1f'):>10}{rate:>12}")
        lines += [f"   ratio {k:<36}{v:>6.2f}x" for k, v in r["ratios"].items()]
        lines.append(f"   identical tokens (every method)  {'yes' if r['identical'] else 'no'}")
        calls = r["aten_calls_per_decode_step"]
        theirs = f"{calls['tf']} ({calls['tf'] / calls['ours']:.2f}x ours)" if "tf" in calls else "n/a"
        lines.append(f"   ATen calls: a decode step {calls['ours']}, a draft step {calls['ours_draft_step']:.0f}; "
                     f"transformers' decode step {theirs}")
        if r.get("host_reads"):  # scripts/bench/syncs.py: each one a stall on a GPU
            h = r["host_reads"]
            lines.append(f"   host reads: a plain step {h['plain_step']:.2f}, a speculative round "
                         f"{h['spec_round']:.2f}; sampled (T 0.7, argmax drafting): a step "
                         f"{h['sampled_plain_step']:.2f}, a round {h['sampled_spec_round']:.2f}; sample drafting: "
                         f"a round {h['sample_drafting_round']:.2f}")
        lines += packing_lines(r.get("packing"))
    lines += costs_lines(result.get("costs"), "float32") + bandwidth_lines(result.get("bandwidth"))
    if result.get("bf16"):
        lines += costs_lines(result["bf16"]["costs"], "bfloat16, vocabulary 262144")
        lines += bandwidth_lines(result["bf16"]["bandwidth"])
    for key, file in (("memory", "bfloat16"), ("memory_float32", "bfloat16"), ("memory_float32_file", "float32")):
        m = result.get(key)
        if m:
            lines += ["", f"== loading memory: the {file} E2B-dimension file, load_target(dtype={m['dtype']}) in a "
                          f"fresh process; text weights as loaded {m['text_weights_mib']:.0f} MiB",
                      f"   peak RSS while loading, over baseline   {m['load_peak_over_text']:.2f}x the text weights "
                      f"(after loading: private {m['after_load']['RssAnon'] - m['baseline']['RssAnon']:.0f} MiB, "
                      f"mapped file {m['after_load']['RssFile'] - m['baseline']['RssFile']:.0f} MiB)",
                      f"   peak RSS in a first forward             {m['forward_peak_over_text']:.2f}x "
                      f"(mapped file pages then resident: "
                      f"{m['after_forward']['RssFile'] - m['baseline']['RssFile']:.0f} MiB)"]
    for section, why in result.get("skipped", {}).items():
        lines.append(f"   {section}: skipped, {why}")
    return "\n".join(lines)


def goals_table(result: dict[str, Any]) -> str:
    """The last block, for the project's developers: each figure a goal is set on, as this run measured it, beside
    the target it is compared with (scripts/benchmark.md, Goals). Whether it is met: `goals` in --json's object."""
    if not result.get("goals"):  # a run of sections that set none (e.g. --only audio) prints no empty heading
        return ""
    width = max(len(g["goal"]) for g in result["goals"]) + 2
    lines = ["", "== for developers: figures of this run beside the project's targets (scripts/benchmark.md, Goals)",
             f"   {'figure':<{width}}{'measured':>10}  target"]
    for g in result["goals"]:
        sign = {True: ">= ", False: "<= "}.get(g.get("at_least"), "")  # a goal without a direction: its limit
        lines.append(f"   {g['goal']:<{width}}{fmt(g['value'], '.4g'):>10}  {sign}{g['limit']:g}")
    return "\n".join(lines)


def packing_lines(p: dict[str, Any] | None) -> list[str]:
    """One line per (shape, dtype) the loaders decided on: the decision and its reason."""
    if not p:
        return []
    unpacked = "" if p["load_s_pack_false"] is None else f", {p['load_s_pack_false']:.2f} s with fast=False"
    lines = [f"   loading: {p['load_s']:.2f} s for the pair{unpacked}"]
    for model in ("target", "assistant"):
        for c in p[model]:
            shape = "x".join(map(str, c["shape"]))
            lines.append(f"     {model:<9} {shape:>11} {c['dtype']:<8} {'packed' if c['packed'] else 'plain':<6} "
                         f"({c['why']})")
    return lines


def costs_lines(c: dict[str, Any] | None, dtype: str) -> list[str]:
    if not c:
        return []
    lines = ["", f"== costs at E2B dimensions ({dtype}), relative to one 1-token decode ({c['decode_s'] * 1e3:.0f} ms, "
                 f"context {c['context']})",
             "   K                    " + "".join(f"{k:>7}" for k in c["verify_over_decode"]),
             "   (K+1)-token verify   " + "".join(f"{v:>7.2f}" for v in c["verify_over_decode"].values()),
             "   K-step draft round   " + "".join(f"{v:>7.3f}" for v in c["draft_round_over_decode"].values())]
    for alpha, s in c["implied_speedup"].items():
        lines.append(f"   implied speedup a={alpha}" + "".join(f"{v:>7.2f}" for v in s["by_k"].values())
                     + f"   best K = {s['best_k']}: {s['speedup']:.2f}x")
    return lines


def bandwidth_lines(b: dict[str, Any] | None) -> list[str]:
    if not b:
        return []
    return [
        "", f"== decode against the memory-bandwidth bound (E2B dimensions, {b['dtype']})",
        f"   copy bandwidth (read + write, {b['copy_mib']} MiB, best)  {b['copy_bytes_per_s'] / 1e9:.1f} GB/s",
        f"   weights read per decode token          {b['bytes_per_token'] / 1e9:.2f} GB",
        f"   bound                                  {b['bound_tokens_per_s']:.2f} tokens/s",
        f"   decode step (median)                   {b['decode_step_tokens_per_s']:.2f} tokens/s = "
        f"{b['fraction_decode_step']:.0%} of the bound (the best step: {b['fraction_best_decode_step']:.0%})",
        f"   read bandwidth (a sum, best)           {b['read_bytes_per_s'] / 1e9:.1f} GB/s",
        f"   each step against its repetition's faster copy or read (median): {b['fraction_paired']:.0%}",
        *[f"   {label:<39}{b[f'{name}_tokens_per_s']:.2f} tokens/s = {b[f'fraction_{name}']:.0%} of the bound"
          for name, label in (("ours_plain", "ours, plain generate (e2b section)"),
                              ("tf_plain", "transformers generate (e2b section)"))
          if b[f"{name}_tokens_per_s"] is not None],
        *([f"   so no float32 decoder here beats transformers generate by more than "
           f"{b['ceiling_over_tf_plain']:.2f}x"] if b["ceiling_over_tf_plain"] is not None else []),
        *[f"   linear() {way:<6} on the largest weight {tuple(b['linear_weight_shape'])}, by rows: "
          + ", ".join(f"{m}: {v / 1e9:.1f} GB/s ({b['linear_rows_slowdown'][way][m]:.2f}x)" for m, v in rates.items())
          for way, rates in b["linear_bytes_per_s_by_rows"].items()],
        *([f"   linear() packed: {b['linear_packed']}"] if b.get("linear_packed") else [])]
