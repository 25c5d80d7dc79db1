r"""Zero-shot CLIP: CLIP's text feature against pooled frame embeddings, nothing trained
(prvr_jax/models/clip_zero_shot, docs/clip_zero_shot.md).

There is nothing to train (train.py says so and stops): evaluate.py runs it without
--checkpoint, with CLIP's weights from `--config.model.clip_weights` where a CLIP tower runs
(`prvr_jax.clip.weights`: OpenAI / open_clip `.pt` / `.bin` / `.safetensors`, Hugging Face
`model.safetensors`); its data is prepared under --output_dir.

  # the synthetic joint-space benchmark (the default variant), mean and max pooling
  python evaluate.py --config=configs/clip_zero_shot.py --output_dir=/tmp/clipzs
  python evaluate.py --config=configs/clip_zero_shot.py:synthetic,max --output_dir=/tmp/clipzs
  # AMDNet's CLIP ViT-B/32 release (frame features and released sentence vectors)
  python evaluate.py --config=configs/clip_zero_shot.py:tvr_clip,max \
      --config.data.dir=/data/prvr/tvr --output_dir=/tmp/clipzs_tvr
  # the same frames, captions through our CLIP text tower instead of the released vectors
  python evaluate.py --config=configs/clip_zero_shot.py:tvr_clip,text_tower \
      --config.data.dir=/data/prvr/tvr --config.model.clip_weights=/data/clip/ViT-B-32.pt \
      --output_dir=/tmp/clipzs_tvr_text
  # frames through our CLIP image tower (MSRVTT frame folders, as T-MASS reads them)
  python evaluate.py --config=configs/clip_zero_shot.py:msrvtt \
      --config.data.annotations=/data/msrvtt/anno --config.data.frames_dir=/data/msrvtt/frames \
      --config.model.clip_weights=/data/clip/ViT-B-32.pt --output_dir=/tmp/clipzs_msrvtt

Variants: `synthetic` (default), `tiny`, `tvr_clip`, `activitynet_clip`, `charades_clip`
(AMDNet's CLIP release: `FeatureData/new_clip_vit_32_<coll>_vid_features.hdf5`, 512-d, not
normalised; at most `max_frames` = 128 rows per video, longer videos averaged into 128
segments as every model on that release reads them), `msrvtt` (frames and captions through
CLIP ViT-B/32). Options (a second `:arg` part): `mean` (default), `max`, `topk` (mean of the 3
best frames), `text_tower` (captions through CLIP's text tower, the release's caption files
tokenised; needs `model.clip_weights`). `--config.model.pooling=` overrides any of them.

Published numbers: none found for this baseline on the PRVR collections. CELL-POSTECH/prvr-ea
runs a zero-shot CLIP4Clip (meanP, 128 raw frames per video; its PRVR_RAWFRAMES.md) on TVR,
ActivityNet, Charades and MSRVTT but its repository states no results, and neither AMDNet's nor
MSC-PRVR's repository reports a zero-shot CLIP row. On MSRVTT 1k-A (whole-video text-video
retrieval) zero-shot CLIP ViT-B/32 with mean-pooled frames is reported by Portillo-Quintero et
al. (2021, "A Straightforward Framework for Video Retrieval Using CLIP") and quoted in
CLIP4Clip's Table 1 (not checked against a run here: no weights or videos on this machine).
On the synthetic benchmark (what the numbers mean: frames and sentence vectors are linear
images of one latent world through one shared projection, a stand-in for CLIP's joint space;
no CLIP weights are involved, so the numbers test the pooling, not CLIP), test split (500
videos, 500 captions; deterministic: nothing is drawn), R@1 / R@5 / R@10 / R@100 / SumR:
  mean   4.6 / 13.4 / 18.2 / 62.2 /  98.4
  max   33.2 / 65.4 / 75.0 / 97.8 / 271.4
  topk  22.4 / 46.4 / 60.4 / 95.4 / 224.6
(a caption names one of its video's 2-3 events: the best frame finds it, the mean dilutes it).
"""

import ml_collections

from prvr_jax import config_lib

MODEL = dict(name='clip_zero_shot', pooling='mean', top_k=3, video_input='features',
             query_input='features', backbone='', hidden_dim=512, num_frames=12,
             num_clips=32, max_frames=128, max_query_len=1, clip_weights='')
LOSS = {}  # nothing is trained

# Sentence vectors (one per caption) of a CLIP feature release.
_CLIP_RELEASE = {'data.text_feature': 'clip'}
# The synthetic benchmark's joint space (`synthetic.SIZES['text_video']`: 12 frames per
# video in the shards, one caption naming one of its 2-3 events).
_SYNTHETIC = {**_CLIP_RELEASE, 'model.num_clips': 12, 'model.max_frames': 12}
PER_DATASET = {
    'synthetic': {**_SYNTHETIC, 'data.synthetic_size': 'text_video',
                  **{f'model.{k}': 128 for k in ('hidden_dim', 'visual_dim', 'query_dim')}},
    'tiny': {**_SYNTHETIC, 'data.synthetic_size': 'text_video_tiny',
             **{f'model.{k}': 32 for k in ('hidden_dim', 'visual_dim', 'query_dim')}},
    'tvr_clip': _CLIP_RELEASE,
    'activitynet_clip': _CLIP_RELEASE,
    'charades_clip': _CLIP_RELEASE,
    # Frames and captions through CLIP ViT-B/32 (T-MASS's frame reader: 12 frames a video).
    'msrvtt': {'model.video_input': 'frames', 'model.query_input': 'tokens',
               'model.backbone': 'ViT-B/32', 'eval.video_batch_size': 16},
}

OPTIONS = {
    'mean': {'model.pooling': 'mean'},
    'max': {'model.pooling': 'max'},
    'topk': {'model.pooling': 'topk'},
    # Captions through CLIP's text tower instead of the release's sentence vectors.
    'text_tower': {'model.query_input': 'tokens', 'model.backbone': 'ViT-B/32',
                   'data.query_tokens': True},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """`arg`: 'VARIANT' or 'VARIANT,OPTION'."""
  config = config_lib.build_config(arg, model=MODEL, loss=LOSS, per_dataset=PER_DATASET,
                                   options=OPTIONS)
  # Nothing is trained (train.py refuses); the optimiser's lr only keeps the config complete
  # for the tools that read every config's optimiser.
  config.optim.lr = 1e-4
  config.data.source = 'frames' if config.model.video_input == 'frames' else 'shards'
  config.data.query_tokens = config.data.get('query_tokens', False)
  config.data.annotations = ''
  config.data.frames_dir = ''
  config.data.clip_vocab = ''  # '' = PRVR_CLIP_VOCAB or an installed open_clip's vocabulary
  return config
