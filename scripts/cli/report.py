"""The statistics of a run, as scripts/generate.py and scripts/chat.py print them: the `stats` object
of `--json` and the block of text on stderr (and chat's `/stats`)."""

from mtp import SpecStats


def stats_json(stats: SpecStats | None, tokens: list[int], seconds: float) -> dict:
    """The `stats` object; plain decoding runs one target forward per token and drafts nothing."""
    forwards = stats.target_forwards if stats else len(tokens)
    return {
        "target_forwards": forwards,
        "drafted": stats.drafted if stats else 0,
        "accepted": stats.accepted if stats else 0,
        "acceptance_rate": stats.acceptance_rate if stats else 0.0,
        "tokens_per_forward": len(tokens) / forwards if forwards else 0.0,
        "seconds": seconds,
        "tokens_per_second": len(tokens) / seconds if seconds else 0.0,
        "rounds": [{"drafted": r.drafted, "accepted": r.accepted} for r in stats.rounds] if stats else [],
    }


def stats_text(result: dict, stats: SpecStats | None) -> str:
    s = result["stats"]
    plain_kind = "plain greedy" if result["sampling"]["temperature"] == 0 else "plain sampling"
    lines = [f"-- {'speculative' if stats else plain_kind} decoding: {len(result['tokens'])} tokens, "
             f"finished by {result['finish_reason']}"]
    if stats:
        by_position = "  ".join(f"{i + 1}: {p:.0%}" for i, p in enumerate(stats.per_position_acceptance))
        lines += [f"target forwards      {s['target_forwards']} (1 prefill + {s['target_forwards'] - 1} verifications; "
                  f"plain decoding needs {len(result['tokens'])})",
                  f"tokens per forward   {s['tokens_per_forward']:.2f}",
                  f"drafted, accepted    {s['drafted']}, {s['accepted']}: acceptance rate {s['acceptance_rate']:.1%}",
                  f"accepted by position {by_position or '-'}"]
    else:
        lines.append(f"target forwards      {s['target_forwards']} (one per token)")
    lines.append(f"time                 {s['seconds']:.2f} s, {s['tokens_per_second']:.1f} tokens/s")
    if "plain" in result:
        p = result["plain"]
        same = "yes" if result["identical"] else f"no: first difference at new token {first_difference(result)}"
        if not result["identical_expected"]:
            same += " (sample drafting: exact in distribution, its draws differ from plain sampling's by design)"
        lines += [f"-- {plain_kind} decoding (--compare): {p['seconds']:.2f} s, {p['tokens_per_second']:.1f} tokens/s",
                  f"identical tokens     {same}",
                  f"speedup              {result['speedup']:.2f}x"]
    return "\n".join(lines)


def first_difference(result: dict) -> int:
    a, b = result["tokens"], result["plain"]["tokens"]
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
