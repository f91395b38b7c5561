const PALETTE = /*PALETTE*/[];
