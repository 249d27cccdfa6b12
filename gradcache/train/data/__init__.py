"""The training data of every mode: where examples come from and in what order a run sees them.

`order.py` is the order of indexed data (a pure function of seed, epoch and step, which makes resume exact);
`streams.py` that of files read in order through a shuffle buffer (webdataset shards, `.jsonl.gz`); `images/` the
image sources (built-in shapes, digits, image folders, caption tables), their in-memory sets, SimCLR's views
and the image modes' training batches; `text/` the (query, positive, hard negatives) rows, the built-in world and
the tokenised batches; `vision_language/` the rows of text and image references of `gradcache train vlm` and their
processor batches.
May import: the library, torch, torchvision, numpy, PIL, `gradcache.models`' VLM collator (what a vision-language
batch is), and `gradcache.train.config` / `errors`; never the
loop, the checkpoints or the modes.
"""
