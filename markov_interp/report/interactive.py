"""The circuit as an interactive figure (circuitsvis style: HTML and a little JavaScript, inline, no network).

`interactive_circuit(graph, model, tokens)` draws the circuit diagram (`circuits.circuit_diagram`) beside a panel.
Clicking a head shows its attention pattern on `tokens` and its OV and QK circuits (`probes.ov_circuits`,
`probes.qk_circuits`: V x V matrices of token embeddings only); hovering an edge shows its path-patching effect
with its SE, whether it was kept, and, where the edges' content was measured (`probes.edge_content`,
`MechanismReport.content`), what it carries. The same fragment is the report's circuit section and displays on its
own in Jupyter (`_repr_html_`): its data and script travel inside it, so it works in a saved notebook offline.
"""

import dataclasses
import html
import hashlib
import json
from typing import Any, Optional

import torch

from markov_interp.report._html import _json_for_script, _jsonable
from markov_interp.report.circuits import circuit_diagram

__all__ = ["InteractiveCircuit", "interactive_circuit"]


_STYLE = """
.icircuit{display:flex;gap:1em;align-items:flex-start;position:relative;flex-wrap:wrap}
.icircuit .ic-diagram{flex:1 1 520px;min-width:0}.icircuit .ic-diagram svg{max-width:100%;height:auto}
.icircuit .ic-panel{flex:1 1 300px;min-width:260px;font-size:.85em}
.icircuit .ic-panel table{border-collapse:collapse;margin:.3em 0}.icircuit .ic-panel td{border:1px solid #fff;
padding:.1em .4em;text-align:right;font-size:.9em;font-variant-numeric:tabular-nums}
.icircuit .ic-panel td.lab{color:#666;background:none;text-align:center}.icircuit .ic-grid{margin:.2em 0 .6em}
.icircuit .ic-grid img{image-rendering:pixelated;border:1px solid #ddd}.icircuit [data-node]{cursor:pointer}
.icircuit [data-node].ic-on{stroke-width:3}.icircuit .ic-tip{position:absolute;display:none;background:#fff;
border:1px solid #999;padding:.3em .5em;font-size:.8em;max-width:360px;pointer-events:none;z-index:5;
box-shadow:0 1px 4px rgba(0,0,0,.2)}
"""

_SCRIPT = r"""
(function(){
const root=document.getElementById(ROOT_ID),data=DATA;
const panel=root.querySelector('.ic-panel'),tip=root.querySelector('.ic-tip');
const fmt=(v,lim)=>v===null?'':(lim<1e-6?v.toFixed(1):v.toFixed(Math.min(4,Math.max(0,2-Math.floor(Math.log10(
lim)))))).replace(/^-(0\.?0*)$/,'$1');
function colour(v,lim,seq){if(v===null)return '#eee';const t=Math.max(-1,Math.min(1,v/lim));
const a=Math.round(255*(1-Math.abs(t)));if(seq)return 'rgb('+a+','+a+',255)';
return t>0?'rgb(255,'+a+','+a+')':'rgb('+a+','+a+',255)';}
function grid(title,m,rows,cols,seq){const flat=m.flat().filter(v=>v!==null).map(Math.abs);
const lim=Math.max(1e-9,...flat),head='<div class="ic-grid"><b>'+title+'</b>';
if(m.length>8){const s=Math.max(4,Math.min(10,Math.floor(300/m.length))),c=document.createElement('canvas');
c.width=c.height=s*m.length;const g=c.getContext('2d');m.forEach((row,i)=>row.forEach((v,j)=>{
g.fillStyle=colour(v,lim,seq);g.fillRect(j*s,i*s,s,s);}));return head+'<br><img alt="'+title+'" src="'+
c.toDataURL()+'"></div>';}
let h=head+'<table><tr><td class="lab"></td>'+cols.map(c=>'<td class="lab">'+c+'</td>').join('')+'</tr>';
m.forEach((row,i)=>{h+='<tr><td class="lab">'+rows[i]+'</td>'+row.map(v=>'<td style="background:'+
colour(v,lim,seq)+'">'+fmt(v,lim)+'</td>').join('')+'</tr>';});return h+'</table></div>';}
function show(name){root.querySelectorAll('[data-node]').forEach(n=>n.classList.toggle('ic-on',
n.dataset.node===name));const d=data.nodes[name];if(!d){panel.innerHTML='<b>'+name+'</b>: '+
(data.about[name]||'not a head: no attention pattern or OV / QK circuit.');return;}
const v=data.states,t=data.tokens;panel.innerHTML='<b>'+name+'</b> (click another head)'+
grid('attention on the sample sequence (rows: queries, columns: keys)',d.attention,t,t,true)+
grid('OV: attended state (rows) to the logit of the next state',d.ov,v,v,false)+
grid('QK: query state (rows) to key state, attention bias',d.qk,v,v,false);}
root.querySelectorAll('[data-node]').forEach(n=>n.addEventListener('click',()=>show(n.dataset.node)));
root.querySelectorAll('[data-edge]').forEach(e=>{e.addEventListener('mousemove',ev=>{const d=data.edges[e.dataset.edge];
const box=root.getBoundingClientRect();tip.style.display='block';tip.style.left=(ev.clientX-box.left+12)+'px';
tip.style.top=(ev.clientY-box.top+12)+'px';tip.textContent=d;});e.addEventListener('mouseleave',()=>{
tip.style.display='none';});});
if(data.first)show(data.first);
})();
"""


@dataclasses.dataclass(frozen=True)
class InteractiveCircuit:
    """The interactive circuit (module docstring): the diagram's SVG and the data its script reads (`data`: per
    head its attention pattern, OV and QK; per edge the text its hover shows). `html()` is the fragment, with its
    style and script; in Jupyter it displays itself."""

    svg: str
    data: dict
    element_id: str = ""  # default: from the content, so the same circuit gives the same file on every build

    def __post_init__(self) -> None:
        if not self.element_id:
            digest = hashlib.sha1((self.svg + json.dumps(self.data, sort_keys=True, default=str)).encode()).hexdigest()
            object.__setattr__(self, "element_id", f"icircuit-{digest[:12]}")

    def html(self) -> str:
        """The self-contained fragment: style, the diagram, the panel, the hover box and the script."""
        script = _SCRIPT.replace("ROOT_ID", _json_for_script(self.element_id)).replace("DATA",
                                                                                    _json_for_script(self.data))
        return (f'<style>{_STYLE}</style><div class="icircuit" id="{html.escape(self.element_id)}">'
                f'<div class="ic-diagram">{self.svg}</div><div class="ic-panel">Click a head for its attention '
                f'pattern and OV / QK circuits; hover an edge for its effect.</div><div class="ic-tip"></div></div>'
                f"<script>{script}</script>")

    def _repr_html_(self) -> str:
        return self.html()


def _edge_text(edge: Any, kept: bool, content: Any) -> str:
    """What hovering an edge shows: its effect and SE, kept or not, and what it carries where that was measured."""
    text = f"{edge.name}: path-patching effect {edge.effect:+.4f} nats (SE {edge.se:.4f}); " + (
        "kept" if kept else "dropped")
    if edge.position_effect == edge.position_effect:  # not NaN: a positional pass ran
        text += f"; positional pass {edge.position_effect:+.4f}"
    if content is not None and edge.name in content:
        text += f". Carries: {content[edge.name].describe()}"
    elif kept and edge.receiver != "logits":  # what an edge into the logits carries is the prediction itself
        text += ". What it carries was not measured."
    return text


@torch.no_grad()
def interactive_circuit(graph: Any, model: Any, tokens: torch.Tensor, *, content: Any = None,
                        cache: Optional[Any] = None) -> InteractiveCircuit:
    """The circuit of `graph` as an interactive figure (module docstring).

    Args:
        graph: a `probes.CircuitGraph` (or a `CircuitVerdict`, `MechanismReport.circuit`).
        model: the hooked model the graph was found in (its OV / QK circuits and attention patterns are shown).
        tokens: one sequence of states, [pos]: the attention patterns are drawn on it.
        content: an `EdgeContent` (`probes.edge_content`, `MechanismReport.content`): what the edges carry.
        cache: a `run_with_cache` whose first sequence starts with `tokens` (the patterns are read from it).

    Returns:
        An `InteractiveCircuit`; `.html()` is the fragment the report embeds.

    >>> from markov_interp import probes
    >>> widget = interactive_circuit(probes.discover_circuit(model, source, batch=batch), model, tokens[0, :12])
    >>> sorted(widget.data["nodes"]), len(widget.data["nodes"]["L1H0"]["ov"])
    (['L0H0', 'L1H0'], 3)
    """
    from markov_interp import probes
    from markov_interp.probes.attention import attention_hook_names

    graph = getattr(graph, "graph", graph)
    names = attention_hook_names(model)
    if cache is None:
        device = next(iter(model.parameters())).device
        _, cache = model.run_with_cache(tokens[None].to(device), names_filter=names)
    n = tokens.shape[0]
    ov, qk = probes.ov_circuits(model), probes.qk_circuits(model)
    heads = [name for name in graph.nodes if "H" in name]
    nodes = {}
    for name in heads:
        layer, head = (int(x) for x in name[1:].split("H"))
        nodes[name] = {"attention": cache[names[layer]][0, head, :n, :n].float().cpu(), "ov": ov[layer, head],
                       "qk": qk[layer, head]}
    kept = set(graph.kept_names)
    edges = {e.name: _edge_text(e, e.name in kept, content) for e in graph.edges}
    on = [h for h in heads if any(h in (e.sender, e.receiver) for e in graph.kept)]
    data = {"nodes": _jsonable(nodes, 4), "edges": edges, "tokens": [str(t) for t in tokens.tolist()],
            "states": [str(s) for s in range(ov.shape[-1])], "first": (on or heads or [None])[0],
            "about": {"embed": "the token embedding (the current state)", "pos": "the position embedding",
                      "logits": "the unembedding: the next state's logits"}}
    return InteractiveCircuit(svg=circuit_diagram(graph), data=data)
