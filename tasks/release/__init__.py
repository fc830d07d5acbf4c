"""Release: stratified splits and nested tiers (``splits``), the release assignment and its
WebDataset shards (``shards``, ``release_image``), the dataset card (``release_card``) and the
manifest, one row per input record (``manifest``)."""
