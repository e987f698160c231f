"""Record what DSPy's JSONAdapter sends to an OpenAI-compatible server (run by hand; DSPy is not a
test dependency): `pip install dspy==3.4.1` in a separate environment, then
`python tests/data/record_dspy_bodies.py > tests/data/dspy_json_adapter_bodies.json`.

A local server answers each request with a fixed JSON object; the bodies it received are printed.
Two ways of naming the model: as DSPy knows nothing of it (`openai/smollm2-135m-instruct`: DSPy
sends no `response_format`, a free-text request), and declared to LiteLLM as taking a response schema
(`litellm.register_model(...)` with `engine="litellm"`: DSPy sends its signature's output fields as
a JSON schema). Signatures: one output field (label) and three (team, priority, angry)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib.metadata import version
from typing import Literal

import dspy
import litellm

SEEN = []


class Recorder(BaseHTTPRequestHandler):
    answer = {}

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        SEEN.append(body)
        out = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": json.dumps(Recorder.answer)}}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


class Route(dspy.Signature):
    """Route the support ticket to a team."""

    ticket: str = dspy.InputField()
    label: Literal["billing", "technical", "account"] = dspy.OutputField()


class Triage(dspy.Signature):
    """Triage the support ticket."""

    ticket: str = dspy.InputField()
    team: Literal["billing", "technical", "account"] = dspy.OutputField(desc="Which team handles the ticket")
    priority: Literal["low", "high"] = dspy.OutputField()
    angry: bool = dspy.OutputField(desc="Is the customer angry")


def main():
    server = HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    litellm.register_model({"openai/smollm2-135m-instruct": {"litellm_provider": "openai", "mode": "chat",
                                                             "supports_response_schema": True}})
    recorded = {"dspy": version("dspy"), "litellm": version("litellm"), "ticket": "TICKET", "bodies": {}}
    for declared in (False, True):
        extra = {"engine": "litellm"} if declared else {}
        lm = dspy.LM("openai/smollm2-135m-instruct", api_base=base, api_key="k", cache=False, num_retries=0, **extra)
        for signature, answer in ((Route, {"label": "billing"}),
                                  (Triage, {"team": "billing", "priority": "low", "angry": False})):
            Recorder.answer = answer
            SEEN.clear()
            with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
                dspy.Predict(signature)(ticket="TICKET")
            recorded["bodies"][f"{signature.__name__}{'-declared' if declared else ''}"] = SEEN[0]
    print(json.dumps(recorded, indent=1))


if __name__ == "__main__":
    main()
