"""The wire formats clients send and read: OpenAI's chat completions (choices, structured outputs,
tools) and completions with the prompt's log-probabilities, the JSON schemas they carry, and vLLM's
tokenizer endpoints and pooling classify. Plain dicts in and out, shared by the service (`serve/`) and batch files
(`jobs/batch.py`); `core/` knows nothing of ids, timestamps or `object` fields.

    chat_request      a chat completion request: what it asks, its prompt, its answer in OpenAI's shape
    schema_questions  an object JSON schema (or a tool's parameters) as a set of finite questions
    completions       a completion request: its prompt rows, log-probabilities and answer
    tokenize_request  /tokenize, /detokenize and /tokenizer_info
    pooling           vLLM's pooling classify: which task a request names, and its answer

Layer: above core (and below serve, jobs and bench, which call it); imports no HTTP framework.
"""
