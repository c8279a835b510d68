"""Native torch backend: the roles that run a step's ops on a transformers Qwen2.5-VL, plus a
tiny tokenizer, processor and task for CPU tests.

Modules are imported on demand (importing the package does not import transformers):
backend (role builders, externals), roles / trainer / critic, model, tokenizer, task,
values / rows, micro / micro_loss, logprob, loss. Routing and chunks are the runtime's.
"""
