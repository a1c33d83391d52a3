// The operator console (admin.html), as ES modules with no build step: the shared layer, then
// one module a view. Each view's module registers its sidebar button's handler.
import "./core.js";
import "./conversations.js";
import "./leads.js";
import "./site.js";
import "./knowledge.js";
import "./insight.js";
import "./inbox.js";
import "./accounts.js";
import "./onboarding.js";
import "./tests.js";
