"""The qualification report (``qualification/report.md``): what fired, for which prompts,
and what the numbers do not show. Worded as the seed words it: heuristics and risk
indicators, not proofs of training-data overlap."""

from __future__ import annotations

from typing import Any

CLAIM_BOUNDARY = (
    "These three signals are heuristics and risk indicators, not proofs. Without a model's training data no "
    "prompt can be shown to be contaminated: a flag says a prompt sits in a densely covered region of this "
    "corpus sample, or that models' outputs for it cluster unusually tightly, or that a model scores higher on "
    "older prompts than on newer ones. Some flagged prompts are simply rendered consistently well — "
    "consistently good is not the same as contaminated. Quarantined prompts are re-examined, never deleted.")


def render_markdown(receipt: dict[str, Any]) -> str:
    r = receipt["results"]
    out = ["# Prompt qualification", "", f"> **What this shows and does not:** {CLAIM_BOUNDARY}", "",
           f"Prompt set `{receipt['inputs']['prompts']['uri']}` (SHA-256 `{receipt['inputs']['prompts']['sha256']}`): "
           f"{r['prompts']['valid']} valid prompts, {r['prompts']['errors']} unusable rows "
           f"{_reasons(r['prompts']['error_reasons'])}. Code `{receipt['code_version']}`.", ""]
    for w in receipt.get("warnings", []):
        out += [f"> **WARNING:** {w}", ""]
    for title, section, name in (("Signal 1: category density", _density_md, "density"),
                                 ("Signal 2: output variance", _variance_md, "variance"),
                                 ("Signal 3: cohort divergence", _cohorts_md, "cohorts")):
        out += [f"## {title}", ""] + (section(r[name]) if r.get(name) else ["Not run.", ""])
    out += _decisions_md(r["decisions"], r.get("rotation"), r.get("normalization"))
    return "\n".join(out) + "\n"


def _reasons(reasons: dict[str, int]) -> str:
    return "(" + ", ".join(f"{k}: {v}" for k, v in reasons.items()) + ")" if reasons else ""


def _density_md(d: dict[str, Any]) -> list[str]:
    out = [f"Corpus captions: {d['sample']['sampled']} sampled of {d['sample']['kept']} kept records "
           f"({d['captions_embedded']} with a caption), text model `{d['text_model']['name']}` "
           f"(weights SHA-256 `{d['text_model']['weights_sha256'][:16]}…`).", ""]
    if d["mode"] == "direct":
        out += [f"Direct mode: score = cosine similarity to the k-th nearest sampled caption (k = {d['k']}); "
                f"flagged when "
                f"above {d['threshold']:.4f}, the {d['reference_quantile']} quantile of the same score among the "
                f"captions themselves ({d['reference_n']} captions). **{d['flagged']} of {d['scored']}** prompts "
                "are in a region denser than that.", ""]
    else:
        out += [f"Taxonomy mode ({len(d['categories'])} categories): categories whose corpus share is at or above "
                f"{d['threshold']:.4f} (the {d['category_quantile']} quantile of shares) are dense. "
                f"**{d['flagged']} of {d['scored']}** prompts fall in a dense category. Prompt-set distribution vs a "
                f"flat target: KL {d['prompt_divergence']['kl_nats']:.4f} nats, total variation "
                f"{d['prompt_divergence']['total_variation']:.4f} (corpus sample: KL "
                f"{d['corpus_divergence']['kl_nats']:.4f}).", "",
                "| category | corpus share | prompts | dense |", "|---|---|---|---|"]
        out += [f"| {c['name']} | {c['corpus_share']:.4f} | {c['prompts']} | {'yes' if c['dense'] else ''} |"
                for c in d["categories"]]
        out.append("")
    return out


def _variance_md(v: dict[str, Any]) -> list[str]:
    ident = v["image_model"]
    label = " — **RANDOM-INIT weights: variances carry no semantic meaning**" if ident.get("random_init") else ""
    out = [f"Trace of the covariance of each prompt's generated images, embedded with `{ident.get('model_id')}`"
           f"{label}; flagged below mean − {v['sd_threshold']} sd of that model's prompts; strong case: flagged for "
           f"≥ {v['strong_min_models']} models. **{v['strong']}** prompts are strong cases.", "",
           "| model | prompts with a variance | mean | sd | cut | flagged |", "|---|---|---|---|---|---|"]
    for m in v["models"]:
        out.append(f"| {m['model']} | {m['n']} | {_g(m['mean'])} | {_g(m['sd'])} | {_g(m['cut'])} | {m['flagged']} |")
    return out + [""]


def _cohorts_md(c: dict[str, Any]) -> list[str]:
    out = [f"Old cohorts {c['old_cohorts']} minus new cohorts {c['new_cohorts']}, {c['method']}; flagged above "
           f"{c['threshold']} points; {int(c['confidence'] * 100)} % bootstrap interval ({c['bootstrap']} "
           "resamples, seeded). A divergence is a risk indicator to weight new-cohort scores by, not an attribution.",
           ""]
    if c.get("skipped"):
        return out + [f"Not computed: {c['skipped']}.", ""]
    out += ["| model | old mean | new mean | raw | divergence | interval | flagged |", "|---|---|---|---|---|---|---|"]
    for m in c["models"]:
        d = m["divergence"]
        iv = m["interval"]
        out.append(f"| {m['model']} | {_num(m['mean_old'])} | {_num(m['mean_new'])} | {_num(m['raw_divergence'])} | "
                   f"{_num(d)} | {'–' if iv is None else f'[{iv[0]:.2f}, {iv[1]:.2f}]'} | "
                   f"{'**yes**' if m['flagged'] else ''} |")
    return out + [""]


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.6g}"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _decisions_md(dec: dict[str, Any], rot: dict[str, Any] | None, norm: dict[str, Any] | None) -> list[str]:
    out = ["## Quarantine and rotation", "",
           f"{dec.get('quarantined', 0)} prompts quarantined for review ({dec.get('strong', 0)} with strong evidence), "
           f"{dec.get('qualified', 0)} qualified. The ledger `qualification/quarantine.parquet` lists each with the "
           "rule that fired and its evidence; nothing was deleted.", ""]
    if rot:
        out += [f"Rotation budget {rot['budget']} of {rot['active']} active prompts; {len(rot['leaving'])} leave "
                f"({rot['reasons']}), {len(rot['joining'])} join from the pool ({rot['pool_eligible']} of "
                f"{rot['pool_size']} pool prompts eligible); {len(rot['anchors'])} anchors never rotate; "
                f"deferred: {len(rot['deferred'])}. New edition `{rot['edition']}` in `prompt_edition/` "
                "(mapping.parquet maps every previous prompt).", ""]
    if norm and norm.get("computed"):
        out += [f"Cross-cycle normalisation ({norm['method']}): offset {norm['offset']:.3f}.", "",
                "| model | full mean | anchor mean | comparable |", "|---|---|---|---|"]
        out += [f"| {m['model']} | {m['full_mean']:.3f} | {m['anchor_mean']:.3f} | {m['comparable_score']:.3f} |"
                for m in norm["models"]]
        out.append("")
    elif norm:
        out += [f"No cross-cycle normalisation: {norm['reason']}.", ""]
    return out
