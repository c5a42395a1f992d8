"""What to bring up: hardware profiles and detection (`hardware`), model dimensions (`models`), parallel plans
and their rules (`plans`), scales = model x hardware x plan x batch (`scales`), verl's DAPO recipe for a scale
(`recipe`) and the compute roofline (`roofline`). Data and closed forms; nothing here launches or measures."""
