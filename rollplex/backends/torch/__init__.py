"""Native torch backend: the numerical core that runs a step's ops on a transformers
Qwen2.5-VL, plus a tiny tokenizer, processor and synthetic visual task for CPU tests.

Modules (imported on demand, so importing this package does not import transformers):
- model:     build_model / save_model / load_model / set_trainable
- tokenizer: build_tokenizer / build_image_processor / encode_prompt
- (prompt records PromptInputs, PromptBatch, collate_prompts live in rollplex.data.prompts)
- task:      VisualTask (seeded coloured-shapes questions) and reward
- engine:    the per-op functions (vision_encode, prefix_forward, expand_prefix, decode,
             response_logprobs, full_logprobs, grpo_loss, group_advantages)
- backend:   TorchBackend, the runtime's view: every GRPO op kind over an environment of
             values (values.py), row chunks and host/device moves (rows.py), the roles
             (roles.py: rollout, reference; trainer.py), task prompts per step (data.py)
"""
